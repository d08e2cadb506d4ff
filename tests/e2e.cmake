# End-to-end tests (tests/e2e/test_*.py): real inferd daemons and workers driven by a pycapnp client,
# written from schemas/inferd.capnp alone. They need the inferd, inferd-worker and inferd-run targets
# built, python3 with pycapnp (`pip install pycapnp`) and the default model; without pycapnp or the
# model a test exits 77 and ctest reports it skipped. Label: e2e (`ctest -L e2e`). They run one at a
# time (RESOURCE_LOCK): each keeps the CPU busy and checks process-wide state such as /dev/shm.
find_package(Python3 COMPONENTS Interpreter)
if(NOT Python3_Interpreter_FOUND)
  message(STATUS "python3 not found: the e2e tests are not registered")
elseif(TARGET inferd AND TARGET inferd-worker)
  set(_e2e_args
    --bin-dir ${CMAKE_BINARY_DIR}/bin
    --model ${PROJECT_SOURCE_DIR}/models/SmolLM2-135M-Instruct.Q4_1.gguf)
  if(TARGET inferd-run)
    list(APPEND _e2e_args --inferd-run $<TARGET_FILE:inferd-run>)
  endif()
  # Seconds each file may take; measured on 2 cores: basic 7, concurrency 10, crash 24, bad_input 2.
  set(_e2e_timeouts basic 180 concurrency 300 crash 480 bad_input 180 placement 180 openai 240
                     prefix_cache 300)
  get_property(_built_backends GLOBAL PROPERTY INFERD_BACKENDS)
  if("opencl" IN_LIST _built_backends)  # the OpenCL backend (skips without a device); measured 17 s on PoCL
    list(APPEND _e2e_timeouts opencl 300)
  endif()
  if("cuda" IN_LIST _built_backends)  # the CUDA backend: refusals without a device, the model on one
    list(APPEND _e2e_timeouts cuda 180)
  endif()
  list(LENGTH _e2e_timeouts _n)
  math(EXPR _last "${_n} - 1")
  foreach(_i RANGE 0 ${_last} 2)
    math(EXPR _j "${_i} + 1")
    list(GET _e2e_timeouts ${_i} _name)
    list(GET _e2e_timeouts ${_j} _timeout)
    add_test(NAME inferd_e2e_${_name}
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/e2e/test_${_name}.py ${_e2e_args})
    set_tests_properties(inferd_e2e_${_name} PROPERTIES
      LABELS e2e
      TIMEOUT ${_timeout}
      SKIP_RETURN_CODE 77
      RESOURCE_LOCK inferd_e2e
      ENVIRONMENT PYTHONDONTWRITEBYTECODE=1)
  endforeach()
  # The second real model (scripts/setup.sh fetches it; the test skips without it): measured 40 s.
  set(_gemma3_args ${_e2e_args})
  list(TRANSFORM _gemma3_args REPLACE "SmolLM2-135M-Instruct.Q4_1.gguf$" "gemma-3-270m-q4_k_m.gguf")
  add_test(NAME inferd_e2e_gemma3
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/e2e/test_gemma3.py ${_gemma3_args})
  set_tests_properties(inferd_e2e_gemma3 PROPERTIES
    LABELS e2e
    TIMEOUT 240
    SKIP_RETURN_CODE 77
    RESOURCE_LOCK inferd_e2e
    ENVIRONMENT PYTHONDONTWRITEBYTECODE=1)
  # Gemma 3 on the OpenCL backend through the daemon (greedy text and teacher-forced agreement equal to the
  # CPU backend's, OpenCL and CPU pipeline stages): measured 100 s on PoCL.
  if("opencl" IN_LIST _built_backends)
    add_test(NAME inferd_e2e_opencl_gemma3
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/e2e/test_opencl.py ${_gemma3_args})
    set_tests_properties(inferd_e2e_opencl_gemma3 PROPERTIES
      LABELS e2e
      TIMEOUT 400
      SKIP_RETURN_CODE 77
      RESOURCE_LOCK inferd_e2e
      ENVIRONMENT PYTHONDONTWRITEBYTECODE=1)
  endif()
endif()
