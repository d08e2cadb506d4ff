# inferd: the supervisor daemon.
add_library(inferd_supervisor STATIC
  supervisor.cpp supervisor.h worker_process.cpp worker_process.h rpc_server.cpp rpc_server.h
  chat_template.cpp chat_template.h text_output.cpp text_output.h generation.h)
target_include_directories(inferd_supervisor PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(inferd_supervisor PUBLIC
  inferd_daemon_support inferd_ipc inferd_engine inferd_tokenizer inferd_sampling inferd_schemas
  CapnProto::capnp-rpc CapnProto::kj-async spdlog::spdlog Threads::Threads)
target_compile_definitions(inferd_supervisor PUBLIC INFERD_VERSION="${PROJECT_VERSION}" ASIO_NO_DEPRECATED)
inferd_target_defaults(inferd_supervisor)
if(TARGET inferd_opencl)  # the workers can run "opencl" / "opencl:N"
  target_compile_definitions(inferd_supervisor PRIVATE INFERD_HAVE_OPENCL=1)
endif()
# GCC 12 reports the storage of kj::Maybe<T> inside KJ's promise plumbing as maybe-uninitialized once
# optimised (a false positive: it is only read after being set); a pragma cannot reach it.
set_source_files_properties(rpc_server.cpp PROPERTIES COMPILE_OPTIONS -Wno-maybe-uninitialized)

add_executable(inferd main.cpp)
target_link_libraries(inferd PRIVATE inferd_supervisor)
inferd_target_defaults(inferd)
set_target_properties(inferd PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
install(TARGETS inferd RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

inferd_add_test(NAME inferd_supervisor_test SOURCES chat_template_test.cpp text_output_test.cpp
                LIBS inferd_supervisor LABELS "unit;sanitize")
