// The contracts of Status and Result<T> (include/kvtier/status.h).
#include "kvtier/status.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <memory>
#include <stdexcept>
#include <string>

namespace kvtier {
namespace {

TEST(StatusTest, OkCarriesNothing) {
  EXPECT_TRUE(Status().ok());
  EXPECT_TRUE(Status::Ok().ok());
  EXPECT_EQ(Status::Ok().code(), StatusCode::kOk);
  EXPECT_EQ(Status::Ok().error_number(), 0);
  EXPECT_EQ(Status::Ok().message(), "");
  EXPECT_EQ(Status::Ok().ToString(), "Ok");
  EXPECT_TRUE(Status::Ok().WithContext("ignored").message().empty());
  Status made_ok(StatusCode::kOk, "a message", EIO);
  EXPECT_TRUE(made_ok.ok());
  EXPECT_EQ(made_ok.message(), "");
  EXPECT_EQ(made_ok.error_number(), 0);
}

TEST(StatusTest, FromErrnoMapsToTheClosestCodeAndKeepsTheErrno) {
  EXPECT_TRUE(Status::FromErrno(0, "nothing failed").ok());
  EXPECT_EQ(Status::FromErrno(ENOSPC, "w").code(), StatusCode::kNoSpace);
  EXPECT_EQ(Status::FromErrno(EDQUOT, "w").code(), StatusCode::kNoSpace);
  EXPECT_EQ(Status::FromErrno(ETIMEDOUT, "w").code(), StatusCode::kTimedOut);
  EXPECT_EQ(Status::FromErrno(ENOENT, "w").code(), StatusCode::kNotFound);
  EXPECT_EQ(Status::FromErrno(EEXIST, "w").code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(Status::FromErrno(EINVAL, "w").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Status::FromErrno(EOPNOTSUPP, "w").code(), StatusCode::kUnsupported);
  Status eio = Status::FromErrno(EIO, "read ab/cd");
  EXPECT_EQ(eio.code(), StatusCode::kIoError);  // the default
  EXPECT_EQ(eio.error_number(), EIO);
  EXPECT_EQ(eio.ToString(), "IoError: read ab/cd: Input/output error (errno 5)");
}

TEST(StatusTest, WithContextPrefixesTheMessageAndKeepsCodeAndErrno) {
  Status s = Status::FromErrno(ENOENT, "open x").WithContext("namespace ns-1");
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.error_number(), ENOENT);
  EXPECT_EQ(s.message(), "namespace ns-1: open x");
  EXPECT_EQ(Status(StatusCode::kCorrupt, "bad header").ToString(), "Corrupt: bad header");
}

TEST(ResultTest, HoldsAValueOrAnError) {
  Result<std::string> v(std::string("bytes"));
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v.status().ok());
  EXPECT_EQ(*v, "bytes");
  EXPECT_EQ(v->size(), 5u);
  Result<std::string> e(Status(StatusCode::kNoSpace, "budget"));
  EXPECT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kNoSpace);
  std::unique_ptr<int> moved = Result<std::unique_ptr<int>>(std::make_unique<int>(7)).value();
  EXPECT_EQ(*moved, 7);
}

TEST(ResultTest, BuiltFromAnOkStatusItHoldsAnInternalError) {
  Result<int> r{Status::Ok()};
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
  EXPECT_EQ(r.status().message(), "Result built from an OK status");
}

TEST(ResultTest, ReadingTheValueOfAnErrorThrowsNamingTheError) {
  Result<int> r{Status(StatusCode::kTimedOut, "load ab/cd")};
  try {
    (void)r.value();
    FAIL() << "value() of an error returned";
  } catch (const std::logic_error& e) {
    EXPECT_STREQ(e.what(), "Result::value() on an error: TimedOut: load ab/cd");
  }
  const Result<int>& c = r;
  EXPECT_THROW((void)c.value(), std::logic_error);
  EXPECT_THROW((void)*r, std::logic_error);
  EXPECT_THROW((void)Result<int>(Status(StatusCode::kInternal, "x")).value(), std::logic_error);
}

}  // namespace
}  // namespace kvtier
