# Fuzz targets of the readers of untrusted input (tests/fuzz/README.md): the config reader, the
# shard reader and the checkpoint metadata reader, each built with AddressSanitizer and UBSan
# from only the sources its reader needs (not the whole build twice), and run by ctest (label
# fuzz) on its seed corpus tests/fuzz/<name>/ for a bounded number of inputs and seconds. A
# crash, a sanitizer report, a leak or a hang fails the test.
option(TRAINER_FUZZ "Build the sanitizer fuzz targets and run them in ctest" ON)
set(FUZZ_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -O1 -g)
include(CheckCSourceCompiles)
set(CMAKE_REQUIRED_FLAGS "-fsanitize=address,undefined")
set(CMAKE_REQUIRED_LINK_OPTIONS "-fsanitize=address,undefined")
check_c_source_compiles("int main(void) { return 0; }" TRAINER_HAVE_SANITIZERS)
unset(CMAKE_REQUIRED_FLAGS)
unset(CMAKE_REQUIRED_LINK_OPTIONS)
if(TRAINER_FUZZ AND NOT TRAINER_HAVE_SANITIZERS)
  message(STATUS "The C compiler has no AddressSanitizer/UBSan: fuzz targets not built")
endif()

# trainer_add_fuzz(NAME RUNS n SECONDS s [ENV VAR=value...] SOURCES files... [LIBS libs...])
function(trainer_add_fuzz name)
  cmake_parse_arguments(F "" "RUNS;SECONDS" "SOURCES;LIBS;ENV" ${ARGN})
  string(REGEX REPLACE "^fuzz_" "" corpus ${name})
  add_executable(${name} tests/fuzz/fuzz_driver.c tests/fuzz/${name}.c ${F_SOURCES})
  # Only the readers' code is linked: functions of those files that the target never reaches
  # (and what they would call) are dropped by section instead of pulling in the rest of the tree.
  target_compile_options(${name} PRIVATE ${FUZZ_FLAGS} -ffunction-sections -fdata-sections)
  target_link_options(${name} PRIVATE ${FUZZ_FLAGS} -Wl,--gc-sections)
  target_link_libraries(${name} PRIVATE MPI::MPI_C m ${F_LIBS})
  add_test(NAME ${name} COMMAND ${name} --corpus ${CMAKE_SOURCE_DIR}/tests/fuzz/${corpus} --runs ${F_RUNS}
           --max-seconds ${F_SECONDS} --seed 1 --timeout-ms 10000 --crash-dir ${CMAKE_BINARY_DIR})
  set_tests_properties(${name} PROPERTIES LABELS fuzz TIMEOUT 120 ENVIRONMENT
    "UBSAN_OPTIONS=print_stacktrace=1;LSAN_OPTIONS=suppressions=${CMAKE_SOURCE_DIR}/tests/fuzz/lsan.supp;${F_ENV}")
endfunction()

if(TRAINER_FUZZ AND TRAINER_HAVE_SANITIZERS)
  set(FUZZ_CONFIG_SOURCES app/config.c app/config_rules.c app/config_from.c model/format/hf_config.c kernels/base/json.c kernels/base/check.c)
  trainer_add_fuzz(fuzz_config RUNS 60000 SECONDS 15 SOURCES ${FUZZ_CONFIG_SOURCES} LIBS ${YAML_LIBRARY})
  target_include_directories(fuzz_config PRIVATE ${YAML_INCLUDE_DIR})
  trainer_add_fuzz(fuzz_shard RUNS 20000 SECONDS 15 SOURCES data/data.c kernels/base/check.c)
  # Every model/format/ckpt*.c: the checkpoint module's files, whatever it is split into.
  file(GLOB FUZZ_CKPT_SOURCES CONFIGURE_DEPENDS model/format/ckpt*.c)
  # Open MPI and HDF5 are built without frame pointers: the leak report needs the slow unwinder
  # to name them (lsan.supp).
  trainer_add_fuzz(fuzz_ckpt_meta RUNS 1200 SECONDS 15 ENV ASAN_OPTIONS=fast_unwind_on_malloc=0
                   SOURCES ${FUZZ_CKPT_SOURCES} ${FUZZ_CONFIG_SOURCES} LIBS ${YAML_LIBRARY} ${HDF5_C_LIBRARIES}
                   Threads::Threads)
  target_include_directories(fuzz_ckpt_meta PRIVATE ${YAML_INCLUDE_DIR} ${HDF5_INCLUDE_DIRS})
  target_compile_definitions(fuzz_ckpt_meta PRIVATE ${HDF5_DEFINITIONS})
endif()
