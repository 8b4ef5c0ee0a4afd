// SafetensorsFile::Parse over arbitrary bytes (the 8-byte header length, the JSON header and the
// data section), then every tensor's data range. A parse may fail; it must never read outside
// the input, throw or crash.

#include <cstdint>

#include "tests/fuzz/fuzz_util.h"
#include "worker/loader/safetensors_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<kvserve::SafetensorsFile> file =
      kvserve::SafetensorsFile::Parse(kvserve::fuzz::MapBytes(data, size));
  if (!file.ok()) return 0;
  volatile uint64_t sink = 0;
  const uint8_t* begin = file->file().data();
  const uint8_t* end = begin + file->file().size();
  for (const kvserve::SafetensorsTensor& t : file->tensors()) {
    if (t.end < t.begin) kvserve::fuzz::Fail("tensor range reversed: " + t.name);
    if (t.nbytes() > 0 && (t.data < begin || t.data + t.nbytes() > end)) {
      kvserve::fuzz::Fail("tensor data outside the file: " + t.name);
    }
    sink = sink + kvserve::fuzz::Touch(t.data, t.nbytes());
    if (file->Find(t.name) == nullptr) kvserve::fuzz::Fail("Find misses " + t.name);
  }
  return 0;
}
