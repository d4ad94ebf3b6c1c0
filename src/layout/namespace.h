// Namespaces (SPEC L1, K2): one directory per cache identity under a storage root.
//
//   <root>/ns-<first 16 hex of the fingerprint>/MANIFEST      canonical text of the NamespaceIdentity
//   <root>/ns-<...>/ab/cd/<key hex>.kvc                        chunk files (chunk_path.h, chunk_format.h)
//
// The fingerprint is the 128-bit XXH3 of CanonicalManifest(identity); it names the directory and is stored in every
// chunk header, so an entry can never be read under another identity. A MANIFEST that differs from the identity
// asked for is refused, never reused.
//
// Thread safety: the free functions are thread-safe. A Namespace is immutable after Open: its accessors may be
// called from any thread; it owns its directory fd, which must outlive every *at() call made relative to it.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/status.h"
#include "layout/chunk_format.h"

namespace kvtier {

struct NamespaceIdentity {
  std::string model;     // model name, e.g. "Qwen/Qwen2.5-7B-Instruct"
  std::string revision;  // weights revision, or a hash given by the user
  std::string kv_dtype;  // e.g. "bfloat16", "fp8_e4m3"
  uint32_t tokens_per_chunk = 0;
  uint32_t blocks_per_chunk = 0;  // 1..kMaxBlocksPerChunk
  uint64_t block_bytes = 0;       // bytes of one GPU block as stored, all layers and all TP ranks
  uint32_t tp_size = 1;
  uint32_t pp_size = 1;
  std::string layout_tag;  // free text describing per-block byte order, e.g. "vllm-canonical-v1"
  uint32_t format_version = kFormatVersion;
};

bool operator==(const NamespaceIdentity& a, const NamespaceIdentity& b);

// The longest model, revision, kv_dtype or layout_tag accepted (bytes, before escaping).
inline constexpr size_t kMaxIdentityStringBytes = 4096;

// kInvalidArgument naming the field when an identity cannot be used: empty model, revision, kv_dtype or layout_tag,
// or one longer than kMaxIdentityStringBytes;
// zero tokens_per_chunk, block_bytes, tp_size or pp_size; blocks_per_chunk outside 1..256; block_bytes above
// kMaxBlockBytes; tokens_per_chunk not a multiple of blocks_per_chunk; format_version other than kFormatVersion.
Status ValidateIdentity(const NamespaceIdentity& id);

// The identity's canonical text, which the fingerprint hashes: one "key=value\n" line per field in a fixed order,
// starting with format_version. String values are escaped: '%', bytes below 0x20 and 0x7f are written as %XX
// (uppercase hex); other bytes as is. Numbers are plain decimal. Deterministic: equal identities give equal text.
std::string CanonicalManifest(const NamespaceIdentity& id);
// K3: what a MANIFEST records of the checksum secret of its entries: "none" without a key (checksum_kind 1), else
// "k3:" + the 32 lowercase hex digits of key->key_id.
std::string ChecksumKeyRecord(const ChecksumKey* key);
// The MANIFEST file: CanonicalManifest(id), then "checksum_key=<record>\n" (ChecksumKeyRecord) when record is not
// empty. An empty record gives the text of a MANIFEST written before kvtier recorded the key (docs/file-format.md).
std::string ManifestText(const NamespaceIdentity& id, const std::string& checksum_key_record);
// Strict inverse of ManifestText: kCorrupt naming the field for an unknown, missing or duplicate key, a line
// without '=', a bad escape, a raw control character, a number that is not canonical decimal or out of range, a
// checksum_key other than "none" or "k3:<32 lowercase hex>", or a missing final newline. checksum_key is optional:
// *checksum_key_record (when given) is set to its value, or to "" when the line is absent. Does not validate
// semantics (ValidateIdentity does).
Result<NamespaceIdentity> ParseManifest(std::string_view text, std::string* checksum_key_record = nullptr);

// 128-bit XXH3 of CanonicalManifest(id): raw 16 bytes (big-endian canonical form) or 32 lowercase hex digits.
Fingerprint16 FingerprintBytes(const NamespaceIdentity& id);
std::string Fingerprint(const NamespaceIdentity& id);
// "ns-" + the first 16 hex digits of Fingerprint(id).
std::string NamespaceDirName(const NamespaceIdentity& id);
// True for names of the form "ns-" + 16 lowercase hex digits.
bool IsNamespaceDirName(std::string_view name);

struct NamespaceOpenOptions {
  bool create = true;      // create the directory and MANIFEST if missing; also requires write access
  mode_t dir_mode = 0750;  // mode of every directory kvtier creates; files get dir_mode without the x bits
  // K2: accept namespace directories that CheckTrustedDirectory refuses (EngineOptions::allow_insecure_root).
  bool allow_insecure = false;
  // K3: ChecksumKeyRecord of the opener's key: written into a new MANIFEST and required of an existing one.
  std::string checksum_key = "none";
};

// K2: whether a directory under a storage root may be trusted not to hold entries or symlinks planted by others;
// mode, uid and gid are the directory's (stat's st_ or statx's stx_ fields). kFailedPrecondition, naming `what`
// and saying how to fix it (chmod, chown or the allow_insecure_root option), when the directory is world-writable
// without the sticky bit, or owned by a user other than this process's effective user or root. group_shared: an
// owner of one of this process's groups (effective or supplementary) is accepted too; a namespace's own
// directories are created by whichever service user of a group-shared deployment came first (docs/operations.md),
// and that user can write nothing there that the group cannot.
Status CheckTrustedDirectory(mode_t mode, uid_t uid, gid_t gid, const std::string& what, bool group_shared);
inline Status CheckTrustedDirectory(const struct stat& st, const std::string& what, bool group_shared) {
  return CheckTrustedDirectory(st.st_mode, st.st_uid, st.st_gid, what, group_shared);
}

// K2 (docs/file-format.md): root without its trailing "/" and "/." components ("L/", "L/." and "L/./" are "L"; "/"
// stays "/"), so that the root checks see a symlink L as one (a trailing "/" makes the kernel resolve it first). Every
// function here that takes a root applies it.
std::string CanonicalRootPath(std::string_view root);

class Namespace {
 public:
  // Opens (and with options.create, creates) the namespace of `id` under `root`.
  //   - root missing -> kNotFound "storage root /x does not exist"; a symlink, not a directory, or (with create)
  //     not writable -> kFailedPrecondition with a message saying which.
  //   - invalid identity -> kInvalidArgument (ValidateIdentity).
  //   - namespace missing and !create -> kNotFound.
  //   - creation: mkdir (EEXIST is fine), then MANIFEST written to a temporary, fsynced and link()ed to MANIFEST:
  //     the first writer wins; everybody then re-reads MANIFEST and compares.
  //   - an existing MANIFEST that differs -> kFailedPrecondition naming the first differing field; one that does
  //     not parse -> kCorrupt.
  //   - K3: an existing MANIFEST whose checksum_key differs from options.checksum_key -> kFailedPrecondition saying
  //     whether the namespace needs a secret, has none, or another one (nothing is written or removed). A MANIFEST
  //     without the line (written before kvtier recorded it) is accepted whatever the opener's key.
  //   - K2, unless options.allow_insecure: the namespace directory, its usage/ directory and its first-level
  //     fan-out directories must pass CheckTrustedDirectory(group_shared = true), else kFailedPrecondition naming
  //     the directory (second-level fan-out directories are checked by the engine when a store first meets one).
  // Concurrent Open of the same new namespace from several processes is safe: all succeed with one MANIFEST.
  static Result<Namespace> Open(const std::string& root, const NamespaceIdentity& id,
                                const NamespaceOpenOptions& options = {});
  // For tools (fsck, gc, stats): opens an existing "ns-<hex>" directory and learns its identity from MANIFEST.
  // kInvalidArgument for a malformed name; kNotFound if absent; kCorrupt if MANIFEST is missing, does not parse,
  // is not canonical or does not hash to the directory name; kFailedPrecondition for another format version.
  // Opens read-only in intent (no writability check); the fd is still usable for unlinkat if permissions allow.
  static Result<Namespace> OpenExisting(const std::string& root, const std::string& ns_dir_name);

  Namespace(Namespace&& other) noexcept;
  Namespace& operator=(Namespace&& other) noexcept;
  Namespace(const Namespace&) = delete;
  Namespace& operator=(const Namespace&) = delete;
  ~Namespace();

  int dirfd() const { return fd_; }                  // O_DIRECTORY|O_NOFOLLOW fd of the namespace directory
  const std::string& path() const { return path_; }  // "<root>/ns-<hex>"
  const std::string& dir_name() const { return dir_name_; }
  const NamespaceIdentity& identity() const { return id_; }
  const Fingerprint16& fingerprint() const { return fingerprint_; }
  // K3: the MANIFEST's checksum_key ("none", "k3:<hex>"), or "" for a MANIFEST without the line.
  const std::string& checksum_key_record() const { return checksum_key_; }
  mode_t dir_mode() const { return dir_mode_; }
  mode_t file_mode() const { return dir_mode_ & ~mode_t{0111}; }
  ChunkGeometry geometry() const { return {id_.blocks_per_chunk, id_.block_bytes}; }

 private:
  Namespace() = default;

  int fd_ = -1;
  std::string path_;
  std::string dir_name_;
  NamespaceIdentity id_;
  Fingerprint16 fingerprint_{};
  std::string checksum_key_;
  mode_t dir_mode_ = 0750;
};

// L5 (docs/file-format.md, "Creation"): a namespace directory whose MANIFEST publication was cut (its creator killed
// between writing .tmp.MANIFEST.* and linking it) holds temporaries and no MANIFEST.
struct ManifestRecovery {
  uint64_t temporaries = 0, temporary_bytes = 0;  // .tmp.MANIFEST.* regular files found
  bool recoverable = false;  // one of them is whole: parses, is canonical and valid, and hashes to the directory
  std::string from;          // its name
  bool recovered = false;    // (apply) MANIFEST now exists, linked from it (or published meanwhile by an engine)
  uint64_t removed = 0, removed_bytes = 0;  // (apply) temporaries removed: at least min_age old, and not a whole one
                                            // left unlinked
};
// For the tools (fsck --repair, gc). Does nothing where MANIFEST exists (its temporaries are SweepTemporaries').
// Otherwise, with apply: links the first whole temporary (by name) to MANIFEST (EEXIST: an engine published it
// meanwhile, fine), then removes the temporaries at least min_age old (a younger one may be a live creator's); a
// torn one is never linked, only removed by age. Without apply: reports only. Errors: as OpenExisting's for the
// root and the directory.
Result<ManifestRecovery> RecoverManifest(const std::string& root, const std::string& ns_dir_name,
                                         std::chrono::seconds min_age, bool apply);

// K2 for the tools (stats, fsck, gc), which act on a whole namespace: the checks Namespace::Open makes of its
// directories (the namespace directory, usage/ and the first-level fan-out directories), and every second-level
// fan-out directory too (the engine checks one when a store first meets it). kFailedPrecondition naming the first
// directory refused (CheckTrustedDirectory's message); errors as OpenExisting's for the root and the directory.
Status CheckNamespaceTree(const std::string& root, const std::string& ns_dir_name);

// Names of the namespace directories ("ns-<16 hex>", real directories only) under root, sorted. Errors as for
// Namespace::Open's root checks.
Result<std::vector<std::string>> ListNamespaces(const std::string& root);

}  // namespace kvtier
