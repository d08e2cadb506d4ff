# Helpers shared by every target: warnings, sanitizers, tests.

# Warnings and sanitizer flags for one of our own targets (never global flags).
function(inferd_target_defaults target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wshadow -Wnon-virtual-dtor
                         -Wno-unused-parameter)
  if(INFERD_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
  if(INFERD_SANITIZE)
    target_compile_options(${target} PRIVATE -fsanitize=${INFERD_SANITIZE} -fno-omit-frame-pointer
                           -fno-sanitize-recover=all)
    target_link_options(${target} PRIVATE -fsanitize=${INFERD_SANITIZE})
  endif()
  if(INFERD_FUZZ)  # coverage for libFuzzer in every library a fuzz target links
    target_compile_options(${target} PRIVATE -fsanitize=fuzzer-no-link)
  endif()
endfunction()

# inferd_add_test(NAME name SOURCES a.cpp ... LIBS lib ... [LABELS l ...])
# One GoogleTest binary per library; every test case becomes a CTest test.
function(inferd_add_test)
  cmake_parse_arguments(T "" "NAME" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT INFERD_BUILD_TESTS)
    return()
  endif()
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main)
  inferd_target_defaults(${T_NAME})
  target_compile_definitions(${T_NAME} PRIVATE
    INFERD_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
    INFERD_TEST_DATA_DIR="${PROJECT_SOURCE_DIR}/tests/data")
  if(NOT T_LABELS)
    set(T_LABELS unit)
  endif()
  gtest_discover_tests(${T_NAME} DISCOVERY_TIMEOUT 60)
  # CMake 3.25's gtest_discover_tests splits a list-valued LABELS property, so the labels are set
  # once the tests are discovered, by a script ctest includes.
  set(labels_script ${CMAKE_CURRENT_BINARY_DIR}/${T_NAME}_labels.cmake)
  file(WRITE ${labels_script}
       "if(${T_NAME}_TESTS)\n"
       "  set_tests_properties(\${${T_NAME}_TESTS} PROPERTIES LABELS \"${T_LABELS}\")\n"
       "endif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${labels_script})
endfunction()

# inferd_add_backend(NAME family TARGET target FACTORY function)
# Registers a compute backend: `target` implements inferd::Backend (workers/backend/include/inferd/
# backend.h) and defines `const inferd::BackendFactory& inferd::function()`. The registry generated in
# workers/registry lists it; nothing else needs to know the backend exists.
function(inferd_add_backend)
  cmake_parse_arguments(B "" "NAME;TARGET;FACTORY" "" ${ARGN})
  if(NOT B_NAME OR NOT B_TARGET OR NOT B_FACTORY)
    message(FATAL_ERROR "inferd_add_backend needs NAME, TARGET and FACTORY")
  endif()
  set_property(GLOBAL APPEND PROPERTY INFERD_BACKENDS "${B_NAME}")
  set_property(GLOBAL APPEND PROPERTY INFERD_BACKEND_TARGETS "${B_TARGET}")
  set_property(GLOBAL APPEND PROPERTY INFERD_BACKEND_FACTORIES "${B_FACTORY}")
endfunction()
