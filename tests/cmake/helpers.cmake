# Shared ctest helpers: trainer_add_test(NAME SOURCE [NP n] [LABELS l...] [ARGS a...]).
# A test with NP runs under mpirun with that many ranks (oversubscribed: CI has 2 cores; not
# bound: for np <= 2 Open MPI binds each rank to one core, leaving OpenMP one thread).
set(TRAINER_MPIRUN ${MPIEXEC_EXECUTABLE} --oversubscribe --bind-to none)
if(DEFINED ENV{USER} AND "$ENV{USER}" STREQUAL "root" OR NOT DEFINED ENV{USER})
  list(APPEND TRAINER_MPIRUN --allow-run-as-root)
endif()
function(trainer_add_test name source)
  cmake_parse_arguments(T "" "NP" "LABELS;ARGS" ${ARGN})
  if(NOT TARGET ${name})
    add_executable(${name} ${source})
    target_link_libraries(${name} PRIVATE trainer_app)
  endif()
  if(T_NP)
    add_test(NAME ${name} COMMAND ${TRAINER_MPIRUN} -np ${T_NP} $<TARGET_FILE:${name}> ${T_ARGS})
  else()
    add_test(NAME ${name} COMMAND ${name} ${T_ARGS})
  endif()
  set_tests_properties(${name} PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1;TRAINER_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
  if(T_LABELS)
    set_tests_properties(${name} PROPERTIES LABELS "${T_LABELS}")
  endif()
endfunction()

# trainer_add_parity(NAME NP key=value...): tests/e2e/test_parity.sh for one layout against the
# single-rank run. PARITY_PREFIX, PARITY_LABEL and PARITY_ENV (a list of VAR=value) in the
# caller's scope select the CPU or the GPU variant.
function(trainer_add_parity name np)
  set(test_name ${PARITY_PREFIX}parity_${name})
  add_test(NAME ${test_name} COMMAND sh ${CMAKE_SOURCE_DIR}/tests/e2e/test_parity.sh ${name} ${np} ${ARGN})
  set_tests_properties(${test_name} PROPERTIES LABELS "${PARITY_LABEL}" ENVIRONMENT
                       "TRAINER_SOURCE_DIR=${CMAKE_SOURCE_DIR};TRAINER_BUILD_DIR=${CMAKE_BINARY_DIR};${PARITY_ENV}")
endfunction()
