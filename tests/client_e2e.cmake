# libinferd-client against the real daemon (label e2e): needs the inferd and inferd-worker binaries and
# the default model; skipped without the model.
if(TARGET inferd_client AND TARGET inferd AND TARGET inferd-worker)
  inferd_add_test(NAME inferd_client_e2e_test
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/client_e2e_test.cpp
    LIBS inferd_client inferd_backend_cpu
    LABELS e2e)
  target_compile_definitions(inferd_client_e2e_test PRIVATE INFERD_BIN_DIR="${CMAKE_BINARY_DIR}/bin")
  add_dependencies(inferd_client_e2e_test inferd inferd-worker)
endif()
