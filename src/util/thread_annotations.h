// Clang's thread-safety analysis (https://clang.llvm.org/docs/ThreadSafetyAnalysis.html): which lock guards which
// member, which function needs or takes which lock. The annotations compile to nothing elsewhere (GCC); the
// `clang-tsa` CMake preset compiles the engine with clang++ -Wthread-safety -Werror=thread-safety
// (scripts/test.sh), so a member touched without its lock fails that build. src/util/mutex.h has the annotated
// Mutex, MutexLock and CondVar to use with them.
#pragma once

#if defined(__clang__)
#define KVTIER_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define KVTIER_THREAD_ANNOTATION(x)
#endif

// A type that is a lock (a "capability" in Clang's terms), e.g. CAPABILITY("mutex").
#define CAPABILITY(name) KVTIER_THREAD_ANNOTATION(capability(name))
// An RAII type that holds a lock for its lifetime (MutexLock).
#define SCOPED_CAPABILITY KVTIER_THREAD_ANNOTATION(scoped_lockable)
// A member read and written only with the lock held.
#define GUARDED_BY(lock) KVTIER_THREAD_ANNOTATION(guarded_by(lock))
// A pointer member whose pointee is read and written only with the lock held.
#define PT_GUARDED_BY(lock) KVTIER_THREAD_ANNOTATION(pt_guarded_by(lock))
// Lock order: this lock is taken before / after the ones named (checked with -Wthread-safety-beta only).
#define ACQUIRED_BEFORE(...) KVTIER_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#define ACQUIRED_AFTER(...) KVTIER_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
// The caller holds the lock(s) when it calls this function (and still does when it returns).
#define REQUIRES(...) KVTIER_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
// The caller must not hold the lock(s): the function takes them itself.
#define EXCLUDES(...) KVTIER_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
// The function takes / gives back the lock(s) (none named: the object itself, for a lock type's own methods).
#define ACQUIRE(...) KVTIER_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) KVTIER_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) KVTIER_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
// Tells the analysis the lock is held here (checked at run time by the lock type, where it can).
#define ASSERT_CAPABILITY(x) KVTIER_THREAD_ANNOTATION(assert_capability(x))
// The function returns a reference to the lock named.
#define RETURN_CAPABILITY(x) KVTIER_THREAD_ANNOTATION(lock_returned(x))
// Turns the analysis off for one function; say why next to it.
#define NO_THREAD_SAFETY_ANALYSIS KVTIER_THREAD_ANNOTATION(no_thread_safety_analysis)
