# inferd-bandwidth: memory read-bandwidth probe (tools/inferd-bandwidth.cpp). Included from tools/CMakeLists.txt.
# No per-target ISA flags: the AVX2/AVX-512 loops carry target attributes and are chosen at run time.
find_package(Threads REQUIRED)
add_executable(inferd-bandwidth ${CMAKE_CURRENT_LIST_DIR}/inferd-bandwidth.cpp)
target_compile_features(inferd-bandwidth PRIVATE cxx_std_20)
target_link_libraries(inferd-bandwidth PRIVATE Threads::Threads)
inferd_target_defaults(inferd-bandwidth)
