# scripts/study/study.py (scaling studies and speedup validation) on CPU ranks with the tiny model: a
# weak-scaling study over 1, 2 and 4 ranks with its plots and expectations, a compare that must
# pass and one that must fail, broken study files, and the slurm launcher with stand-ins for
# sbatch and srun. The Python that runs them is the first of python3 on PATH and Debian's
# /usr/bin/python3 that has PyYAML and matplotlib (scripts/setup/setup.sh installs them with apt).
set(TRAINER_STUDY_PYTHON python3)
foreach(py python3 /usr/bin/python3)
  execute_process(COMMAND ${py} -c "import yaml, matplotlib" RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
  if(rc EQUAL 0)
    set(TRAINER_STUDY_PYTHON ${py})
    break()
  endif()
endforeach()
foreach(t scaling compare bad_input slurm)
  add_test(NAME study_${t} COMMAND sh ${CMAKE_SOURCE_DIR}/tests/e2e/test_study_${t}.sh)
  set_tests_properties(study_${t} PROPERTIES LABELS tools ENVIRONMENT
                       "TRAINER_SOURCE_DIR=${CMAKE_SOURCE_DIR};TRAINER_BUILD_DIR=${CMAKE_BINARY_DIR};TRAINER_PYTHON=${TRAINER_STUDY_PYTHON}")
endforeach()
