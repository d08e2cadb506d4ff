# Numerics against llama.cpp's committed outputs (needs the default model; the synthetic one is committed).
inferd_add_test(NAME inferd_numerics_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/numerics_test.cpp
  LIBS inferd_backend_cpu inferd_tokenizer
  LABELS model)
