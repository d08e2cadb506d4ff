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
endif()
