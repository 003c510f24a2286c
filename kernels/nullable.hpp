// nullable<T>: a T* parameter that may be nullptr ("absent") and that takes
// no part in template argument deduction, so that a caller can write
// matmul_forward(out, inp, weight, nullptr, ...) and T comes from the others.
#pragma once

namespace megascope::kernels {

namespace detail {
template <typename T>
struct NoDeduce {
  using type = T;
};
}  // namespace detail

template <typename T>
using nullable = typename detail::NoDeduce<T>::type*;

}  // namespace megascope::kernels
