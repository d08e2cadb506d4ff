# The prefill GEMM (gemm.h); included by kernels/cpu/CMakeLists.txt after inferd_kernels_cpu exists.
target_sources(inferd_kernels_cpu PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/gemm.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gemm_avx2.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gemm_avx2_k.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gemm_avx512.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gemm_avx512_k.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gemm_avx512_repacked.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gemm_internal.h
  ${CMAKE_CURRENT_LIST_DIR}/gemm_tiles.h
  ${CMAKE_CURRENT_LIST_DIR}/include/inferd/kernels/gemm.h)
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/gemm_avx512.cpp ${CMAKE_CURRENT_LIST_DIR}/gemm_avx512_k.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gemm_avx512_repacked.cpp PROPERTIES COMPILE_OPTIONS
  "-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx512vnni;-mavx2;-mfma;-mf16c")
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/gemm_avx2.cpp ${CMAKE_CURRENT_LIST_DIR}/gemm_avx2_k.cpp
  PROPERTIES COMPILE_OPTIONS "-mavx2;-mfma;-mf16c")

inferd_add_test(NAME inferd_kernels_gemm_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/gemm_test.cpp
                LIBS inferd_kernels_cpu LABELS unit sanitize)

add_executable(inferd-gemm-bench ${CMAKE_CURRENT_LIST_DIR}/gemm_bench.cpp)
target_link_libraries(inferd-gemm-bench PRIVATE inferd_kernels_cpu ${CMAKE_DL_LIBS})
inferd_target_defaults(inferd-gemm-bench)
