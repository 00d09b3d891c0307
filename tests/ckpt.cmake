trainer_add_test(test_ckpt tests/test_ckpt.c NP 2)
