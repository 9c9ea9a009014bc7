// Offline stand-in (see ../../../README.md): the part of torch_npu's OpCommand.h that
// binding.cpp uses.
#pragma once
#include <functional>
#include <string>

namespace at_npu {
namespace native {
class OpCommand {
public:
    // torch_npu: enqueue `func` on the current stream's task queue (run inline when the queue is off).
    static void RunOpApiV2(const std::string &op_name, const std::function<int()> &func, bool sync = false);
};
}  // namespace native
}  // namespace at_npu
