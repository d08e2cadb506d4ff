# GGUF reader against the committed corrupt-file set (tests/data/corrupt, made by
# tools/reference/make_corrupt_ggufs.py). Labelled `sanitize`: run it under ASan+UBSan too
# (a build dir configured with -DINFERD_SANITIZE=address,undefined, then `ctest -L sanitize`).
inferd_add_test(NAME inferd_gguf_corrupt_test
                SOURCES ${CMAKE_CURRENT_LIST_DIR}/gguf_corrupt_test.cpp
                LIBS inferd_gguf
                LABELS unit sanitize)
if(TARGET inferd_gguf_corrupt_test)
  target_compile_definitions(inferd_gguf_corrupt_test PRIVATE
    INFERD_GGUF_CORRUPT_DIR="${CMAKE_CURRENT_LIST_DIR}/data/corrupt")
  # CMake 3.25's gtest_discover_tests splits a list-valued LABELS property ("unit;sanitize" arrives
  # as LABELS=unit plus a stray property), so set the labels again once the tests are discovered.
  set(labels_script ${CMAKE_CURRENT_BINARY_DIR}/inferd_gguf_corrupt_test_labels.cmake)
  file(WRITE ${labels_script}
       "if(inferd_gguf_corrupt_test_TESTS)\n"
       "  set_tests_properties(\${inferd_gguf_corrupt_test_TESTS} PROPERTIES LABELS \"unit;sanitize\")\n"
       "endif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${labels_script})
endif()
