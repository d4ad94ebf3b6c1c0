// An engine with a JobClient over it: how tests move bytes through the job API (ChunkTransfer in, JobResult out),
// which is a client of the engine's slot path (docs/architecture.md, "One data path"). Tests reach the engine
// through -> and * as through the unique_ptr they held before, and the jobs through `jobs`.
//
// Header only: a test that includes it links kvtier_policy (CMakeLists.txt does for the engine's tests).
#pragma once

#include <memory>
#include <utility>

#include "kvtier/engine.h"
#include "policy/job_client.h"
#include "transfer/device_copier.h"

namespace kvtier::test {

struct JobEngine {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<JobClient> jobs;  // declared last, so destroyed first: it finishes its jobs on the engine

  Engine* operator->() const { return engine.get(); }
  Engine& operator*() const { return *engine; }
  void reset() {
    jobs.reset();
    engine.reset();
  }
  // Waits for the job id names (a refused submission passes its error through).
  Result<JobResult> Run(const Result<JobId>& id, int64_t timeout_ms = 30000) {
    if (!id.ok()) return id.status();
    return jobs->Wait(id.value(), timeout_ms);
  }
};

// A JobClient (copier: null = the host copier) over an engine already open.
inline Result<JobEngine> WithJobs(std::unique_ptr<Engine> engine, std::unique_ptr<DeviceCopier> copier = nullptr,
                                  JobClientOptions options = {}) {
  JobEngine e;
  e.engine = std::move(engine);
  auto client = JobClient::Create(e.engine.get(), std::move(copier), options);
  if (!client.ok()) return client.status();
  e.jobs = std::move(client).value();
  return e;
}

inline Result<JobEngine> OpenWithJobs(const EngineOptions& options, std::unique_ptr<DeviceCopier> copier = nullptr,
                                      JobClientOptions client_options = {}) {
  auto opened = Engine::Open(options);
  if (!opened.ok()) return opened.status();
  return WithJobs(std::move(opened).value(), std::move(copier), client_options);
}

}  // namespace kvtier::test
