// The socket directory check (rpc_server.h): the daemon puts its socket only in a directory that no other
// user controls.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "rpc_server.h"

namespace inferd::daemon {
namespace {

class SocketDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::path(testing::TempDir()) / ("socket_dir_" + std::to_string(::getpid()));
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  std::string make_dir(const char* name, mode_t mode) {
    const std::string p = (root_ / name).string();
    EXPECT_EQ(::mkdir(p.c_str(), 0700), 0);
    EXPECT_EQ(::chmod(p.c_str(), mode), 0);
    return p;
  }
  std::filesystem::path root_;
};

TEST_F(SocketDirTest, OwnDirectoryIsAccepted) {
  EXPECT_TRUE(check_socket_dir(make_dir("own", 0750)).is_ok());
  EXPECT_TRUE(check_socket_dir(make_dir("sticky", 01777)).is_ok());  // like /tmp
}

TEST_F(SocketDirTest, SymlinksFilesAndWorldWritableDirectoriesAreRefused) {
  const std::string target = make_dir("target", 0700);
  const std::string link = (root_ / "link").string();
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  Status s = check_socket_dir(link);
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("symbolic link"), std::string::npos) << s.to_string();

  const std::string file = (root_ / "file").string();
  std::ofstream(file) << "x";
  EXPECT_FALSE(check_socket_dir(file).is_ok());

  s = check_socket_dir(make_dir("open", 0777));
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("writable by every user"), std::string::npos) << s.to_string();
}

TEST_F(SocketDirTest, ADirectoryOfAnotherUserIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a directory to another uid";
  const std::string dir = make_dir("theirs", 0755);
  ASSERT_EQ(::chown(dir.c_str(), 12345, 12345), 0);
  Status s = check_socket_dir(dir);
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("belongs to uid 12345"), std::string::npos) << s.to_string();
}

}  // namespace
}  // namespace inferd::daemon
