# cuDNN: the fused attention path (kernels/cuda/attn_cudnn.cu) links cuDNN into trainer_cuda,
# and its GPU test (label gpu) compares it with the CPU reference. The GPU hosts bring their own
# libcudnn.so.9 (9.14); the code uses nothing newer.
if(TRAINER_HAVE_CUDA)
  trainer_add_test(test_cudnn_attn tests/gpu/test_cudnn_attn.c LABELS gpu)
  target_link_libraries(test_cudnn_attn PRIVATE ${CUDNN_LIBRARY})
endif()
