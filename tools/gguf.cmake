# inferd-gguf: prints a GGUF file's header, metadata and tensor table (validating it on the way).
add_executable(inferd-gguf ${CMAKE_CURRENT_LIST_DIR}/inferd-gguf.cpp)
target_link_libraries(inferd-gguf PRIVATE inferd_gguf)
inferd_target_defaults(inferd-gguf)
