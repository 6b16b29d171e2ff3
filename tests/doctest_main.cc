// Tolerances: doctest::Approx(x).epsilon(e) passes when |a - x| < e * (scale + max(|a|, |x|)),
// and scale is 1 unless set, so for values below 1 the epsilon acts as an absolute bound, not a
// relative one. Write .scale(0) for a relative tolerance, or CHECK(std::abs(a - x) <= tol) for
// an absolute one.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
