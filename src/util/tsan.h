// KVTIER_BENIGN_RACE(ptr, bytes, why): tells ThreadSanitizer that concurrent writes to [ptr, ptr + bytes) are
// intended (a no-op in other builds). For scratch buffers that benchmarks and tests hand to several chunks of one
// load job at once, knowingly: a JobClient copies chunks out on several copier lanes (docs/architecture.md, "One data
// path"), so such chunks' bytes land concurrently, and the caller does not read them (or they are all the same bytes).
// Never for memory whose contents matter.
#pragma once

#if defined(__SANITIZE_THREAD__)
extern "C" void AnnotateBenignRaceSized(const char* file, int line, const volatile void* mem, unsigned long size,
                                        const char* description);
#define KVTIER_BENIGN_RACE(ptr, bytes, why) AnnotateBenignRaceSized(__FILE__, __LINE__, (ptr), (bytes), (why))
#else
#define KVTIER_BENIGN_RACE(ptr, bytes, why) ((void)(ptr), (void)(bytes), (void)(why))
#endif
