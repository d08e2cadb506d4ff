# Differential tests of inferd_tokenizer against llama.cpp's reference data (tests/data/tokenizer/,
# produced by tools/reference/gen_tokenizer_refs.py). Included from tests/CMakeLists.txt.
find_package(nlohmann_json 3 REQUIRED)
inferd_add_test(NAME inferd_tokenizer_refs_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/tokenizer_refs_test.cpp
  LIBS inferd_tokenizer inferd_gguf nlohmann_json::nlohmann_json
  LABELS model)
