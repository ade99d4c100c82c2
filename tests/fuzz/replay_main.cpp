// Replays fuzz inputs without libFuzzer: every file named on the command line, or every file in
// every directory named, goes once through LLVMFuzzerTestOneInput. Used by ctest to run the
// checked-in corpus under the sanitizers of the build (ASan+UBSan in the asan presets).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

int main(int argc, char** argv) {
  std::size_t replayed = 0;
  const auto replay = [&](const std::filesystem::path& file) {
    std::ifstream in(file, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
    ++replayed;
  };
  for (int a = 1; a < argc; ++a) {
    const std::filesystem::path path(argv[a]);
    if (!std::filesystem::exists(path)) {
      std::fprintf(stderr, "no such corpus: %s\n", argv[a]);
      return 1;
    }
    if (std::filesystem::is_directory(path)) {
      for (const auto& entry : std::filesystem::directory_iterator(path))
        if (entry.is_regular_file()) replay(entry.path());
    } else {
      replay(path);
    }
  }
  std::printf("replayed %zu inputs\n", replayed);
  return replayed > 0 ? 0 : 1;
}
