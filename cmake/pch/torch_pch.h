// The precompiled header every LibTorch target shares (see cmake/dscpp_helpers.cmake).
#pragma once
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>
