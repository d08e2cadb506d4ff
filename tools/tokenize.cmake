# inferd-tokenize: tokenizes text with a model's vocabulary, like llama.cpp's llama-tokenize.
add_executable(inferd-tokenize ${CMAKE_CURRENT_LIST_DIR}/inferd-tokenize.cpp)
target_link_libraries(inferd-tokenize PRIVATE inferd_cli inferd_tokenizer inferd_gguf)
inferd_target_defaults(inferd-tokenize)
