# inferctl: the command-line client of the daemon. It uses only libinferd-client's public header,
# like any other application would.
if(TARGET inferd_client)
  include(GNUInstallDirs)
  find_package(nlohmann_json 3 REQUIRED)
  add_executable(inferctl inferctl.cpp)
  target_link_libraries(inferctl PRIVATE inferd_client nlohmann_json::nlohmann_json Threads::Threads)
  inferd_target_defaults(inferctl)
  set_target_properties(inferctl PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
  # Installed next to its library wherever the prefix goes.
  set_target_properties(inferctl PROPERTIES INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
  install(TARGETS inferctl RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT client)
endif()
