// Offline stand-in definitions (see README.md): enough to link and load binding.cpp on a CPU.
// The "launches" count themselves so a check can see that the op body ran to its end.
#include <cstdint>

#include "aclrtlaunch_splitkv_attention_mix.h"
#include "aclrtlaunch_splitkv_combine.h"
#include "aclrtlaunch_splitkv_split.h"
#include "torch_npu/csrc/core/npu/NPUStream.h"
#include "torch_npu/csrc/framework/OpCommand.h"

namespace c10_npu {
aclrtStream NPUStream::stream(bool) const { return nullptr; }
NPUStream getCurrentNPUStream(c10::DeviceIndex) { return NPUStream(); }
}  // namespace c10_npu

namespace at_npu {
namespace native {
void OpCommand::RunOpApiV2(const std::string &, const std::function<int()> &func, bool) { (void)func(); }
}  // namespace native
}  // namespace at_npu

extern "C" {
int splitkv_offline_launches = 0;
uint32_t aclrtlaunch_splitkv_split(uint32_t, aclrtStream, void *, void *, void *, void *, void *, void *, void *,
                                   void *)
{
    ++splitkv_offline_launches;
    return 0;
}
uint32_t aclrtlaunch_splitkv_combine(uint32_t, aclrtStream, void *, void *, void *, void *, void *)
{
    ++splitkv_offline_launches;
    return 0;
}
int splitkv_offline_mix_launches = 0;
uint32_t aclrtlaunch_splitkv_attention_mix(uint32_t, aclrtStream, void *, void *, void *, void *, void *, void *,
                                           void *, void *, void *, void *)
{
    ++splitkv_offline_launches;
    ++splitkv_offline_mix_launches;
    return 0;
}
}
