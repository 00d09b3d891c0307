# Tests of the config module (app/config.c): loading, errors, validation rules, round trip.
trainer_add_test(test_config tests/test_config.c)
