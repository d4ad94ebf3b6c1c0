#include "trace/trace_recorder.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "trace/mini_json.h"

namespace kvtier {
namespace {

using kvtier::testing::JsonValue;
using kvtier::testing::MiniJsonParser;

class TraceRecorderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvtier-trace-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf '" + dir_ + "'").c_str()); }

  std::string PathFor(const std::string& name) const { return dir_ + "/" + name; }

  static std::string ReadFile(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  // Parses the file and returns its traceEvents array (failing the test if the file is not a valid trace).
  static std::vector<JsonValue> Events(const std::string& path) {
    std::string text = ReadFile(path);
    MiniJsonParser parser(text);
    std::optional<JsonValue> v = parser.Parse();
    EXPECT_TRUE(v.has_value()) << parser.error() << "\n" << text.substr(0, 2000);
    if (!v) return {};
    EXPECT_EQ(v->type, JsonValue::Type::kObject);
    EXPECT_TRUE(v->Has("traceEvents"));
    if (!v->Has("traceEvents")) return {};
    return (*v)["traceEvents"].array;
  }

  std::string dir_;
};

TEST_F(TraceRecorderTest, WritesValidChromeTraceEvents) {
  const std::string path = PathFor("t.json");
  auto opened = TraceRecorder::Open(path);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  TraceRecorder& t = **opened;
  EXPECT_TRUE(t.enabled());
  t.NameThread(7, "reactor");
  t.Complete("read", "io", 1'234'567, 89'012, 7, {{"bytes", 4096}, {"slot", 3}});
  t.Instant("preload \"start\"\n", "engine", 2'000'000, 7);
  t.Counter("pool", 3'000'000, {{"in_use", 12}, {"free", 4}});
  EXPECT_EQ(t.events_recorded(), 4u);
  ASSERT_TRUE(t.Close().ok());
  EXPECT_FALSE(t.enabled());

  std::vector<JsonValue> events = Events(path);
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0]["ph"].string, "M");
  EXPECT_EQ(events[0]["args"]["name"].string, "reactor");
  const JsonValue& read = events[1];
  EXPECT_EQ(read["name"].string, "read");
  EXPECT_EQ(read["cat"].string, "io");
  EXPECT_EQ(read["ph"].string, "X");
  EXPECT_DOUBLE_EQ(read["ts"].number, 1234.567);
  EXPECT_DOUBLE_EQ(read["dur"].number, 89.012);
  EXPECT_EQ(read["pid"].number, getpid());
  EXPECT_EQ(read["tid"].number, 7);
  EXPECT_EQ(read["args"]["bytes"].number, 4096);
  EXPECT_EQ(read["args"]["slot"].number, 3);
  EXPECT_EQ(events[2]["ph"].string, "i");
  EXPECT_EQ(events[2]["name"].string, "preload \"start\"\n");
  EXPECT_EQ(events[3]["ph"].string, "C");
  EXPECT_EQ(events[3]["args"]["in_use"].number, 12);

  // Events after Close are dropped, and Close is idempotent.
  t.Complete("late", "io", 0, 1, 1);
  EXPECT_TRUE(t.Close().ok());
  EXPECT_EQ(Events(path).size(), 4u);
}

TEST_F(TraceRecorderTest, EmptyTraceIsValid) {
  const std::string path = PathFor("empty.json");
  {
    auto opened = TraceRecorder::Open(path);
    ASSERT_TRUE(opened.ok());
    EXPECT_TRUE(Events(path).empty());  // valid even before any flush
  }
  EXPECT_TRUE(Events(path).empty());
}

TEST_F(TraceRecorderTest, PythonJsonModuleAcceptsTheFile) {
  if (std::system("python3 -c 'import json' >/dev/null 2>&1") != 0) GTEST_SKIP() << "python3 not available";
  const std::string path = PathFor("py.json");
  {
    auto opened = TraceRecorder::Open(path);
    ASSERT_TRUE(opened.ok());
    for (int i = 0; i < 100; ++i) (*opened)->Complete("op\t\x01", "c", i * 1000, 500, 1, {{"i", uint64_t(i)}});
  }
  std::string cmd =
      "python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); "
      "sys.exit(0 if len(d[\"traceEvents\"])==100 else 1)' " +
      path;
  EXPECT_EQ(std::system(cmd.c_str()), 0);
}

TEST_F(TraceRecorderTest, DisabledRecorderWritesNothing) {
  auto disabled = TraceRecorder::Disabled();
  EXPECT_FALSE(disabled->enabled());
  disabled->Complete("read", "io", 0, 1, 1, {{"bytes", 1}});
  disabled->Instant("x", "y", 0, 1);
  disabled->Counter("pool", 0, {{"in_use", 1}});
  {
    ScopedTrace scope(disabled.get(), "scope", "test");
    scope.AddArg("k", 1);
  }
  {
    ScopedTrace scope(nullptr, "scope", "test");  // a null recorder is the usual "off"
  }
  EXPECT_EQ(disabled->events_recorded(), 0u);
  EXPECT_TRUE(disabled->Flush().ok());
  EXPECT_TRUE(disabled->Close().ok());

  auto from_empty_path = TraceRecorder::Open("");
  ASSERT_TRUE(from_empty_path.ok());
  EXPECT_FALSE((*from_empty_path)->enabled());
  // Nothing was created in the test directory.
  EXPECT_EQ(std::system(("test -z \"$(ls -A '" + dir_ + "')\"").c_str()), 0);
}

TEST_F(TraceRecorderTest, ScopedTraceRecordsDurationAndArgs) {
  const std::string path = PathFor("scoped.json");
  auto opened = TraceRecorder::Open(path);
  ASSERT_TRUE(opened.ok());
  const int64_t before = TraceRecorder::NowNs();
  {
    ScopedTrace scope(opened->get(), "copy", "device");
    scope.AddArg("bytes", 1 << 20);
    for (const char* key : {"a", "b", "c", "d", "e"}) scope.AddArg(key, 1);  // d and e exceed kMaxArgs: dropped
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const int64_t after = TraceRecorder::NowNs();
  ASSERT_TRUE((*opened)->Close().ok());
  std::vector<JsonValue> events = Events(path);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["name"].string, "copy");
  EXPECT_EQ(events[0]["tid"].number, TraceRecorder::CurrentThreadId());
  EXPECT_GE(events[0]["dur"].number, 2000.0);
  EXPECT_GE(events[0]["ts"].number, before / 1000.0 - 1);
  EXPECT_LE(events[0]["ts"].number + events[0]["dur"].number, after / 1000.0 + 1);
  EXPECT_EQ(events[0]["args"]["bytes"].number, 1 << 20);
  EXPECT_EQ(events[0]["args"].object.size(), ScopedTrace::kMaxArgs);
  EXPECT_FALSE(events[0]["args"].Has("d"));
}

TEST_F(TraceRecorderTest, ConcurrentWritersProduceEveryEvent) {
  const std::string path = PathFor("concurrent.json");
  auto opened = TraceRecorder::Open(path);
  ASSERT_TRUE(opened.ok());
  TraceRecorder* t = opened->get();
  constexpr int kThreads = 4;
  constexpr int kEvents = 2500;  // ~170 bytes each: 1.7 MB, so at least one flush past kFlushBytes
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([t, i] {
      for (int j = 0; j < kEvents; ++j) {
        t->Complete("write-with-a-long-name-to-fill-the-buffer", "io", TraceRecorder::NowNs(), 10,
                    static_cast<uint32_t>(i + 1), {{"thread", uint64_t(i)}, {"seq", uint64_t(j)}});
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_TRUE(t->Close().ok());
  std::vector<JsonValue> events = Events(path);
  ASSERT_EQ(events.size(), size_t{kThreads} * kEvents);
  std::set<std::pair<int, int>> seen;
  for (const JsonValue& e : events) {
    seen.insert({static_cast<int>(e["args"]["thread"].number), static_cast<int>(e["args"]["seq"].number)});
  }
  EXPECT_EQ(seen.size(), size_t{kThreads} * kEvents);
}

TEST_F(TraceRecorderTest, FileStaysValidWhenTheProcessDiesWithoutClose) {
  const std::string path = PathFor("abrupt.json");
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto opened = TraceRecorder::Open(path);
    if (!opened.ok()) _exit(10);
    for (int i = 0; i < 10; ++i) (*opened)->Complete("flushed", "io", i, 1, 1);
    if (!(*opened)->Flush().ok()) _exit(11);
    for (int i = 0; i < 5; ++i) (*opened)->Complete("lost", "io", i, 1, 1);
    _exit(0);  // no Close, no destructor
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);
  std::vector<JsonValue> events = Events(path);
  ASSERT_EQ(events.size(), 10u);
  for (const JsonValue& e : events) EXPECT_EQ(e["name"].string, "flushed");
}

TEST_F(TraceRecorderTest, OpenFailureIsAnError) {
  auto opened = TraceRecorder::Open(PathFor("no/such/dir/t.json"));
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), StatusCode::kNotFound) << opened.status().ToString();
  EXPECT_NE(opened.status().message().find("no/such/dir"), std::string::npos);
}

TEST_F(TraceRecorderTest, NoSpaceOnTheFirstWriteIsAnError) {
  if (access("/dev/full", W_OK) != 0) GTEST_SKIP() << "/dev/full not available";
  auto opened = TraceRecorder::Open("/dev/full");
  ASSERT_FALSE(opened.ok());  // the initial write fails
  EXPECT_EQ(opened.status().code(), StatusCode::kNoSpace) << opened.status().ToString();
}

}  // namespace
}  // namespace kvtier
