#include <cmath>

#include "engine/model.h"

namespace engine {

double Metric::value() const { return exp_of_mean ? std::exp(mean()) : mean(); }

}  // namespace engine
