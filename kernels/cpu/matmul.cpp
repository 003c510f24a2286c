// CPU dense layer: Eigen GEMMs over row-major maps of the raw pointers
// (single-threaded unless Eigen is built with OpenMP). See kernels/matmul.hpp.
#include "kernels/matmul.hpp"

#include <Eigen/Core>

#include "kernels/check.hpp"

namespace megascope::kernels {

namespace {

template <typename T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T>
using MapMat = Eigen::Map<Mat<T>>;
template <typename T>
using MapConstMat = Eigen::Map<const Mat<T>>;
template <typename T>
using MapRow = Eigen::Map<Eigen::Matrix<T, 1, Eigen::Dynamic>>;
template <typename T>
using MapConstRow = Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>>;

void check_dims(std::int64_t N, std::int64_t C, std::int64_t OC) {
  MEGASCOPE_KERNEL_REQUIRE(N >= 0 && C >= 0 && OC >= 0);
}

}  // namespace

template <typename T>
void matmul_forward(T* out, const T* inp, const T* weight, nullable<const T> bias, std::int64_t N, std::int64_t C,
                    std::int64_t OC) {
  check_dims(N, C, OC);
  if (N == 0 || OC == 0) return;
  MapMat<T> o(out, N, OC);                // (N, OC)
  const MapConstMat<T> x(inp, N, C);      // (N, C)
  const MapConstMat<T> w(weight, OC, C);  // (OC, C)
  o.noalias() = x * w.transpose();
  if (bias != nullptr) o.rowwise() += MapConstRow<T>(bias, OC);
}

template <typename T>
void matmul_backward_input(T* dinp, const T* dout, const T* weight, std::int64_t N, std::int64_t C, std::int64_t OC) {
  check_dims(N, C, OC);
  if (N == 0 || C == 0) return;
  MapMat<T> dx(dinp, N, C);               // (N, C)
  const MapConstMat<T> dy(dout, N, OC);   // (N, OC)
  const MapConstMat<T> w(weight, OC, C);  // (OC, C)
  dx.noalias() = dy * w;
}

template <typename T>
void matmul_backward_weight(T* dweight, nullable<T> dbias, const T* dout, const T* inp, std::int64_t N, std::int64_t C,
                            std::int64_t OC) {
  check_dims(N, C, OC);
  if (OC == 0) return;
  const MapConstMat<T> dy(dout, N, OC);  // (N, OC)
  const MapConstMat<T> x(inp, N, C);     // (N, C)
  if (C > 0) {
    MapMat<T> dw(dweight, OC, C);  // (OC, C)
    dw.noalias() += dy.transpose() * x;
  }
  if (dbias != nullptr) MapRow<T>(dbias, OC) += dy.colwise().sum();
}

#define MEGASCOPE_INSTANTIATE(T)                                                                               \
  template void matmul_forward<T>(T*, const T*, const T*, const T*, std::int64_t, std::int64_t, std::int64_t); \
  template void matmul_backward_input<T>(T*, const T*, const T*, std::int64_t, std::int64_t, std::int64_t);    \
  template void matmul_backward_weight<T>(T*, T*, const T*, const T*, std::int64_t, std::int64_t, std::int64_t);
MEGASCOPE_INSTANTIATE(float)
MEGASCOPE_INSTANTIATE(double)
#undef MEGASCOPE_INSTANTIATE

}  // namespace megascope::kernels
