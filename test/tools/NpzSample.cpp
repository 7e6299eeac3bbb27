// kiln-npz-sample: writes the .npz archives the `npz-numpy-load` test hands
// to numpy.load (test/scripts/check-npz-numpy.py), so that NumPy itself
// checks what runtime/Npz writes: DIR/plain.npz through writeNpz, and
// DIR/zip64.npz through serializeNpz with zip64 records on every member.
// Both hold the same arrays, whose values the script knows:
//   f32   float32 [2,3]  i * 0.5 - 1
//   i64   int64   [4]    (i - 1) * 2^40
//   u8    uint8   [3]    {0, 128, 255}
//   b     bool    [3]    {true, false, true}
//   f16   float16 [2]    {65504, -2.5}
//   s     float64 []     0.125
//   e     int32   [0,5]
//
//   kiln-npz-sample DIR
#include <fstream>
#include <iostream>
#include <string>

#include "runtime/Npz.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: kiln-npz-sample DIR\n";
    return 2;
  }
  using kiln::DType;
  using kiln::Tensor;
  Tensor f32(DType::F32, {2, 3}), i64(DType::I64, {4}), u8(DType::U8, {3}), b(DType::Bool, {3});
  Tensor f16(DType::F16, {2}), s(DType::F64, {}), e(DType::I32, {0, 5});
  for (int i = 0; i < 6; ++i) f32.setDouble(i, i * 0.5 - 1);
  for (int i = 0; i < 4; ++i) i64.setInt(i, (int64_t{i} - 1) << 40);
  u8.setInt(1, 128);
  u8.setInt(2, 255);
  b.setInt(0, 1);
  b.setInt(2, 1);
  f16.setDouble(0, 65504);
  f16.setDouble(1, -2.5);
  s.setDouble(0, 0.125);
  std::vector<kiln::NpzArray> arrays = {{"f32", f32}, {"i64", i64}, {"u8", u8}, {"b", b},
                                        {"f16", f16}, {"s", s},     {"e", e}};
  const std::string dir = argv[1];
  if (kiln::Status st = kiln::writeNpz(dir + "/plain.npz", arrays); !st) {
    std::cerr << "kiln-npz-sample: " << st.error().message() << "\n";
    return 1;
  }
  auto zip64 = kiln::serializeNpz(arrays, /*forceZip64=*/true);
  if (!zip64) {
    std::cerr << "kiln-npz-sample: " << zip64.error().message() << "\n";
    return 1;
  }
  std::ofstream out(dir + "/zip64.npz", std::ios::binary);
  out.write(zip64->data(), static_cast<std::streamsize>(zip64->size()));
  if (!out.flush()) {
    std::cerr << "kiln-npz-sample: cannot write " << dir << "/zip64.npz\n";
    return 1;
  }
  return 0;
}
