# Hugging Face interop: the JSON reader, safetensors reader and writer, names and config.json
# checks (unit test).
trainer_add_test(test_safetensors tests/test_safetensors.c)
