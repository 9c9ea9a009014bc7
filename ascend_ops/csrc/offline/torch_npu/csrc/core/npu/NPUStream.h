// Offline stand-in (see ../../../../README.md): the part of torch_npu's NPUStream.h that
// binding.cpp uses.
#pragma once
#include <c10/core/Device.h>

#include "acl/acl_base.h"

namespace c10_npu {
class NPUStream {
public:
    // torch_npu: stream(true) first drains the task queue; stream(false) does not.
    aclrtStream stream(bool need_empty = true) const;
};
NPUStream getCurrentNPUStream(c10::DeviceIndex device_index = -1);
}  // namespace c10_npu
