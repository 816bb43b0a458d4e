// libFuzzer target: a tokenizer.json from a hub (tokenizer/), read and, when it reads, used to
// encode and decode a Unicode stress text as the data loaders and `engine generate` do.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tokenizer/hf_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  auto tokenizer = engine::tokenizer::HfTokenizer::FromJson(json, "fuzz/tokenizer.json");
  if (!tokenizer.ok()) return 0;
  static constexpr std::string_view kText =
      "Hello, world! <s> naïve café 東京 🙂 \t\n  x\xe2\x80\x8b y 12345 don't";
  for (bool special : {false, true}) {
    const std::vector<int64_t> ids = (*tokenizer)->Encode(kText, special);
    (*tokenizer)->Decode(ids, /*skip_special_tokens=*/special);
  }
  return 0;
}
