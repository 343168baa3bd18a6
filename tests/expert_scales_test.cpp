// validate_expert_scales (model/load.h): the ue8m0 byte 255 is refused with tensor, row and group
// named, and so are 253 and 254 (overflow with the e2m1 maximum); any other byte passes.
#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "model/load.h"

namespace wren {
namespace {

TEST(ExpertScales, Bytes253To255AreRejectedWithRowAndGroup) {
  std::vector<uint8_t> s1(2 * 2, 127), s2(3 * 2, 252), s3(2 * 2, 0);
  ExpertRef e;
  e.name = "model.layers.1.block_sparse_moe.experts.5";
  e.file = "shard.safetensors";
  e.w1 = {2, 64, nullptr, s1.data()};
  e.w2 = {3, 64, nullptr, s2.data()};
  e.w3 = {2, 64, nullptr, s3.data()};
  EXPECT_NO_THROW(validate_expert_scales(e));
  s2[1 * 2 + 1] = 255;
  try {
    validate_expert_scales(e);
    FAIL() << "scale byte 255 must be rejected";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("experts.5.w2.weight_scale': row 1, group 1"), std::string::npos)
        << err.what();
  }
  // 253 and 254 are valid ue8m0 codes, but 6 · 2^126 overflows f32: refused too (issue #19).
  for (uint8_t b : {uint8_t(253), uint8_t(254)}) {
    s2[1 * 2 + 1] = 252;
    s3[1 * 2 + 0] = b;
    try {
      validate_expert_scales(e);
      FAIL() << "scale byte " << int(b) << " must be rejected";
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find("experts.5.w3.weight_scale': row 1, group 0: ue8m0 scale byte " +
                                              std::to_string(b)), std::string::npos) << err.what();
      EXPECT_NE(std::string(err.what()).find("overflows f32"), std::string::npos) << err.what();
    }
    s3[1 * 2 + 0] = 0;
  }
  EXPECT_NO_THROW(validate_expert_scales(e));
}

}  // namespace
}  // namespace wren
