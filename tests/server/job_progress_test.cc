#include "server/job_progress.h"

#include <gtest/gtest.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/text_format.h>

#include <string>

namespace joule::server {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// A value for every field of `m` that differs from its default and from its neighbours',
// so a copy to the wrong field shows.
void FillEveryField(Message* m) {
  const Descriptor* d = m->GetDescriptor();
  const Reflection* r = m->GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    const int n = f->number();
    if (f->is_repeated() && f->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE) {
      r->AddDouble(m, f, n + 0.25);
      continue;
    }
    if (f->is_repeated()) {
      ASSERT_EQ(f->cpp_type(), FieldDescriptor::CPPTYPE_MESSAGE) << f->full_name();
      Message* e = r->AddMessage(m, f);
      e->GetReflection()->SetInt32(e, e->GetDescriptor()->field(0), n);
      continue;
    }
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32: r->SetInt32(m, f, n); break;
      case FieldDescriptor::CPPTYPE_INT64: r->SetInt64(m, f, 1000 + n); break;
      case FieldDescriptor::CPPTYPE_DOUBLE: r->SetDouble(m, f, n + 0.5); break;
      case FieldDescriptor::CPPTYPE_BOOL: r->SetBool(m, f, true); break;
      case FieldDescriptor::CPPTYPE_STRING: r->SetString(m, f, "s" + std::to_string(n)); break;
      case FieldDescriptor::CPPTYPE_ENUM:
        r->SetEnumValue(m, f, f->enum_type()->value(f->enum_type()->value_count() - 1)->number());
        break;
      case FieldDescriptor::CPPTYPE_MESSAGE: {
        Message* sub = r->MutableMessage(m, f);
        sub->GetReflection()->SetInt32(sub, sub->GetDescriptor()->field(0), n);
        break;
      }
      default: FAIL() << "no test value for " << f->full_name();
    }
  }
}

// The wire copy in ApplyRankProgress rests on this: every field a rank sends has the
// job's field of the same number, name and type.
TEST(JobProgressTest, EveryRankFieldIsTheJobsFieldOfTheSameNumberNameAndType) {
  const Descriptor* rank = v1::RankProgress::descriptor();
  const Descriptor* job = v1::JobProgress::descriptor();
  for (int i = 0; i < rank->field_count(); ++i) {
    const FieldDescriptor* f = rank->field(i);
    const FieldDescriptor* g = job->FindFieldByNumber(f->number());
    ASSERT_NE(g, nullptr) << f->name();
    EXPECT_EQ(g->name(), f->name());
    EXPECT_EQ(g->type(), f->type()) << f->name();
    EXPECT_EQ(g->is_repeated(), f->is_repeated()) << f->name();
    if (f->message_type() != nullptr) {
      EXPECT_EQ(g->message_type(), f->message_type());
    }
  }
}

// Every field's values as text (all of a repeated field's), for comparing one field of
// two messages of different types.
std::string FieldText(const Message& m, const FieldDescriptor* f) {
  std::string out, one;
  const Reflection* r = m.GetReflection();
  if (!f->is_repeated()) {
    google::protobuf::TextFormat::PrintFieldValueToString(m, f, -1, &out);
    return out;
  }
  for (int i = 0; i < r->FieldSize(m, f); ++i) {
    google::protobuf::TextFormat::PrintFieldValueToString(m, f, i, &one);
    out += one + ";";
  }
  return out;
}

TEST(JobProgressTest, RankZerosFiguresReplaceTheShownOnesAndTheCoordinatorsOwnStay) {
  v1::RankProgress rank0;
  FillEveryField(&rank0);
  v1::JobProgress shown;
  FillEveryField(&shown);  // an older report, and the coordinator's own figures
  // The older report's values differ from the rank's (a copy that did nothing shows).
  shown.set_epoch(99);
  shown.set_transport("old");
  shown.mutable_links(0)->set_peer(42);
  const v1::JobProgress before = shown;
  ApplyRankProgress(rank0, &shown);
  const Descriptor* job = v1::JobProgress::descriptor();
  int from_rank = 0, kept = 0;
  for (int i = 0; i < job->field_count(); ++i) {
    const FieldDescriptor* g = job->field(i);
    const FieldDescriptor* f = v1::RankProgress::descriptor()->FindFieldByNumber(g->number());
    if (f != nullptr) {
      EXPECT_EQ(FieldText(shown, g), FieldText(rank0, f)) << g->name() << ": not the rank's";
      ++from_rank;
    } else {
      EXPECT_EQ(FieldText(shown, g), FieldText(before, g)) << g->name() << ": not kept";
      ++kept;
    }
  }
  EXPECT_EQ(from_rank, v1::RankProgress::descriptor()->field_count());
  // job energy, budget used, budget warning, straggler, phase, job power, rank powers
  EXPECT_EQ(kept, 7);
}

TEST(JobProgressTest, ThePhaseBecomesTrainingAtTheFirstStepUnlessAHeartbeatSaidOtherwise) {
  v1::JobProgress shown;
  v1::RankProgress rank0;
  ApplyRankProgress(rank0, &shown);  // connected, no step yet
  EXPECT_EQ(shown.phase(), v1::JOB_PHASE_UNSPECIFIED);
  rank0.set_step(1);
  ApplyRankProgress(rank0, &shown);
  EXPECT_EQ(shown.phase(), v1::JOB_PHASE_TRAINING);
  shown.set_phase(v1::JOB_PHASE_EVALUATION);  // a heartbeat's
  rank0.set_step(2);
  ApplyRankProgress(rank0, &shown);
  EXPECT_EQ(shown.phase(), v1::JOB_PHASE_EVALUATION);
}

TEST(JobProgressTest, EveryRankPhaseFoldsIntoTheJobsAndUnknownValuesAreUnspecified) {
  const google::protobuf::EnumDescriptor* phases = v1::RankPhase_descriptor();
  for (int i = 0; i < phases->value_count(); ++i) {
    const auto phase = static_cast<v1::RankPhase>(phases->value(i)->number());
    const v1::JobPhase job = JobPhaseOf(phase);
    switch (phase) {
      case v1::RANK_PHASE_UNSPECIFIED: EXPECT_EQ(job, v1::JOB_PHASE_UNSPECIFIED); break;
      case v1::RANK_PHASE_EVALUATION: EXPECT_EQ(job, v1::JOB_PHASE_EVALUATION); break;
      case v1::RANK_PHASE_CHECKPOINT: EXPECT_EQ(job, v1::JOB_PHASE_CHECKPOINT); break;
      case v1::RANK_PHASE_STAGING: EXPECT_EQ(job, v1::JOB_PHASE_STAGING); break;
      default: EXPECT_EQ(job, v1::JOB_PHASE_TRAINING) << phases->value(i)->name();
    }
  }
  // A newer worker's phase this coordinator does not know: not taken for training.
  EXPECT_EQ(JobPhaseOf(static_cast<v1::RankPhase>(99)), v1::JOB_PHASE_UNSPECIFIED);
  EXPECT_EQ(JobPhaseOf(static_cast<v1::RankPhase>(-1)), v1::JOB_PHASE_UNSPECIFIED);
}

}  // namespace
}  // namespace joule::server
