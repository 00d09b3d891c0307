# Tests of the config module (app/config.c): loading, errors, validation rules, round trip.
trainer_add_test(test_config tests/unit/test_config.c)
