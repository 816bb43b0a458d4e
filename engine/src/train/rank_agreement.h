// Before a data-parallel stage takes its first step, its ranks check that they run the same stage:
// ranks started by hand, by torchrun or by a scheduler each read their own pipeline file, and a
// rank whose file differs (another learning rate, another model) would otherwise train on in
// silence, its gradients averaged with the others'.
//
// Every rank hashes each field of its stage's configuration, and the data and plugins its plan
// resolved; the ranks compare the hashes in two collectives (every rank calls AgreeOnTheStage, in
// the same order among the group's collectives). On a difference every rank fails with the same
// error, naming the first field that differs (`stage[0].optimizer`).
//
// Thread safety: the training thread.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "dist/data_parallel.h"
#include "engine/pipeline.pb.h"
#include "engine/status.h"

namespace engine {

// What a stage's ranks must agree on: (what to call it, its text), one entry per field of `stage`
// in the order of its declaration, then `extra` (the plan's data and plugins), in order.
std::vector<std::pair<std::string, std::string>> StageAgreementEntries(
    const proto::Stage& stage, const std::string& stage_path,
    std::vector<std::pair<std::string, std::string>> extra);

// Fails, on every rank, when the ranks' entries differ, naming the first entry that does.
Status AgreeOnTheStage(DataParallel& ranks,
                       const std::vector<std::pair<std::string, std::string>>& entries);

}  // namespace engine
