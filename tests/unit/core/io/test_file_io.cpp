// test_file_io.cpp: the atomic replacement of a file (io::write_file_atomically, io::AtomicFile) and FileError.
#include "core/io/file_io.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <string>

#include "tests/unit/temp_dir.h"

namespace fs = std::filesystem;

namespace mt {
namespace {

std::string read_all(const std::string& path) { return io::read_text_file(path); }

void put(const std::string& path, const std::string& text) {
  fs::remove(path);
  io::write_file_durably(path, text);
}

// The message of the FileError that f throws (a test failure when it throws none).
template <class F>
std::string file_error_of(F&& f) {
  std::string what;
  EXPECT_THROW(
      try { f(); } catch (const FileError& e) {
        what = e.what();
        throw;
      },
      FileError);
  return what;
}

// While alive, no file may grow past `bytes` (a full disk, as a write sees it; binds even for root).
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    EXPECT_EQ(::getrlimit(RLIMIT_FSIZE, &old_), 0);
    old_handler_ = ::signal(SIGXFSZ, SIG_IGN);  // the write then fails with EFBIG instead of killing us
    struct rlimit tiny = old_;
    tiny.rlim_cur = bytes;
    EXPECT_EQ(::setrlimit(RLIMIT_FSIZE, &tiny), 0);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &old_);
    ::signal(SIGXFSZ, old_handler_);
  }

 private:
  struct rlimit old_;
  void (*old_handler_)(int);
};

TEST(WriteFileAtomically, ReplacesTheFileAndLeavesNoTemporary) {
  testing_util::TempDir dir;
  const std::string path = dir / "f.yaml";
  put(path, "old contents\n");
  io::write_file_atomically(path, "new\n");
  EXPECT_EQ(read_all(path), "new\n");
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  io::write_file_atomically(dir / "fresh", "made\n");  // no file before
  EXPECT_EQ(read_all(dir / "fresh"), "made\n");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 2);
}

TEST(WriteFileAtomically, AWriteThatFailsMidwayKeepsTheOldFileAndRemovesTheTemporary) {
  testing_util::TempDir dir;
  const std::string path = dir / "f.bin";
  put(path, "old contents\n");
  const std::string big(1 << 16, 'x');
  std::string msg;
  {
    FileSizeLimit limit(4096);  // the first 4096 bytes go to the temporary, then the "disk" is full
    msg = file_error_of([&] { io::write_file_atomically(path, big); });
  }
  EXPECT_NE(msg.find(path + ".tmp"), std::string::npos) << msg;
  EXPECT_NE(msg.find("write failed"), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::strerror(EFBIG)), std::string::npos) << msg;
  EXPECT_EQ(read_all(path), "old contents\n");
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

TEST(WriteFileAtomically, ARenameThatFailsKeepsWhatIsThereAndRemovesTheTemporary) {
  testing_util::TempDir dir;
  const std::string path = dir / "taken";
  fs::create_directories(path + "/inside");  // a directory cannot be replaced by a file
  const std::string msg = file_error_of([&] { io::write_file_atomically(path, "new\n"); });
  EXPECT_NE(msg.find(path + ": cannot rename " + path + ".tmp to it"), std::string::npos) << msg;
  EXPECT_TRUE(fs::is_directory(path + "/inside"));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

TEST(WriteFileAtomically, ErrorsNameThePathAndTheOsError) {
  testing_util::TempDir dir;
  const std::string path = dir / "no/such/dir/f";
  const std::string msg = file_error_of([&] { io::write_file_atomically(path, "x"); });
  EXPECT_NE(msg.find(path + ".tmp: cannot create file"), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::strerror(ENOENT)), std::string::npos) << msg;
}

TEST(WriteFileAtomically, ReplacesAStaleTemporaryAndTakesANamedOne) {
  testing_util::TempDir dir;
  const std::string path = dir / "latest";
  put(path + ".tmp", "a crashed writer's half");
  io::write_file_atomically(path, "one\n");
  EXPECT_EQ(read_all(path), "one\n");
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  io::write_file_atomically(path, "two\n", dir / ".tmp.latest");
  EXPECT_EQ(read_all(path), "two\n");
  EXPECT_FALSE(fs::exists(dir / ".tmp.latest"));
}

TEST(AtomicFile, UntilCommitThePathKeepsItsOldContents) {
  testing_util::TempDir dir;
  const std::string path = dir / "data.bin";
  put(path, "old");
  {
    io::AtomicFile f(path);
    f.write("new ");
    f.write("contents");
    EXPECT_EQ(f.offset(), 12);
    EXPECT_EQ(read_all(path), "old");
    EXPECT_EQ(read_all(f.tmp_path()), "new contents");
    f.commit();
    EXPECT_EQ(read_all(path), "new contents");
    EXPECT_FALSE(fs::exists(path + ".tmp"));
  }
  EXPECT_EQ(read_all(path), "new contents");  // a committed file stays when the AtomicFile goes
}

TEST(AtomicFile, DestroyedWithoutCommitRemovesTheTemporary) {
  testing_util::TempDir dir;
  const std::string path = dir / "data.bin";
  put(path, "old");
  try {
    io::AtomicFile f(path);
    f.write("half of the new");
    EXPECT_TRUE(fs::exists(path + ".tmp"));
    throw std::runtime_error("the producer failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(read_all(path), "old");
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

TEST(AtomicFile, SyncedFilesGoInTogetherAndTakeNoMoreWrites) {
  testing_util::TempDir dir;
  io::AtomicFile a(dir / "a"), b(dir / "b");
  a.write("A");
  b.write("B");
  a.sync();
  b.sync();
  EXPECT_NE(file_error_of([&] { a.write("more"); }).find(a.tmp_path()), std::string::npos);
  a.commit();
  b.commit();
  EXPECT_EQ(read_all(dir / "a"), "A");
  EXPECT_EQ(read_all(dir / "b"), "B");
  EXPECT_NE(file_error_of([&] { a.commit(); }).find(dir / "a"), std::string::npos);
}

TEST(FileError, IsWhatTheMappingAndReadingErrorsAre) {
  testing_util::TempDir dir;
  const std::string missing = dir / "missing";
  try {
    MappedFile::open(missing);
    ADD_FAILURE() << "mapped a missing file";
  } catch (const FileError& e) {  // a MapFileError, caught as the file problem it is
    EXPECT_NE(dynamic_cast<const MapFileError*>(&e), nullptr);
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
  EXPECT_NE(file_error_of([&] { io::read_text_file(missing); }).find(missing + ": cannot open"), std::string::npos);
  EXPECT_NE(file_error_of([&] { io::map_file(missing); }).find(std::strerror(ENOENT)), std::string::npos);
}

}  // namespace
}  // namespace mt
