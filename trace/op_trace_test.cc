#include "trace/op_trace.h"

#include <fstream>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "base/fifo_feeder_for_tests.h"

namespace remat {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr std::uint64_t kMiB = 1 << 20;

// The index of tensor `id`, failing the test if there is none.
std::uint32_t T(const OpTrace& trace, std::string_view id) {
  std::optional<std::uint32_t> t = FindOpTensor(trace, id);
  EXPECT_TRUE(t.has_value()) << id;
  return t.value_or(kNoOpIndex);
}

// The error message of parsing `text`.
std::string ErrorOf(const std::string& text) {
  absl::StatusOr<OpTrace> trace = ParseOpTrace(text, "t.jsonl");
  EXPECT_FALSE(trace.ok());
  if (trace.ok()) return "";
  EXPECT_TRUE(absl::IsInvalidArgument(trace.status())) << trace.status();
  return std::string(trace.status().message());
}

TEST(OpTraceTest, ParsesEveryRecordKind) {
  absl::StatusOr<OpTrace> trace = ParseOpTrace(
      R"({"op":"phase","name":"forward"}
{"op":"constant","id":"w1","bytes":4096}
{"op":"constant","id":"x0","bytes":1024}
{"op":"call","name":"mm","inputs":["w1","x0"],"outputs":[{"id":"x1","bytes":1048576}],"cost_ns":52000}
{"op":"call","name":"view","inputs":["x1"],"outputs":[{"id":"v1","alias_of":"x1"}],"cost_ns":0}
{"op":"use","ids":["x1","v1"]}
{"op":"phase","name":"backward"}
{"op":"call","name":"mm","inputs":["x1","x1"],"outputs":[{"id":"g","bytes":8},{"id":"h","bytes":16}],"cost_ns":7}
{"op":"release","id":"x1"}
)",
      "t.jsonl");
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->name, "t.jsonl");
  EXPECT_THAT(trace->names, ElementsAre("forward", "mm", "view", "backward"));
  ASSERT_EQ(trace->records.size(), 9u);
  ASSERT_EQ(trace->tensors.size(), 6u);

  const OpRecord& phase = trace->records[0];
  EXPECT_EQ(phase.kind, OpKind::kPhase);
  EXPECT_EQ(phase.line, 1u);
  EXPECT_EQ(trace->names[phase.name], "forward");

  const OpRecord& constant = trace->records[1];
  EXPECT_EQ(constant.kind, OpKind::kConstant);
  EXPECT_EQ(constant.name, kNoOpIndex);
  EXPECT_THAT(constant.outputs, ElementsAre(T(*trace, "w1")));
  const OpTensor& w1 = trace->tensors[T(*trace, "w1")];
  EXPECT_TRUE(w1.constant);
  EXPECT_EQ(w1.bytes, 4096u);
  EXPECT_EQ(w1.producer, 1u);
  EXPECT_EQ(w1.storage, T(*trace, "w1"));
  EXPECT_FALSE(w1.is_view());
  EXPECT_EQ(w1.released_by, kNoOpIndex);

  const OpRecord& mm = trace->records[3];
  EXPECT_EQ(mm.kind, OpKind::kCall);
  EXPECT_EQ(mm.line, 4u);
  EXPECT_EQ(trace->names[mm.name], "mm");
  EXPECT_EQ(mm.cost_ns, 52000);
  EXPECT_THAT(mm.inputs, ElementsAre(T(*trace, "w1"), T(*trace, "x0")));
  EXPECT_THAT(mm.outputs, ElementsAre(T(*trace, "x1")));
  const OpTensor& x1 = trace->tensors[T(*trace, "x1")];
  EXPECT_FALSE(x1.constant);
  EXPECT_EQ(x1.bytes, kMiB);
  EXPECT_EQ(x1.producer, 3u);
  EXPECT_EQ(x1.released_by, 8u);

  const OpTensor& v1 = trace->tensors[T(*trace, "v1")];
  EXPECT_TRUE(v1.is_view());
  EXPECT_EQ(v1.alias_of, T(*trace, "x1"));
  EXPECT_EQ(v1.storage, T(*trace, "x1"));
  EXPECT_EQ(v1.bytes, 0u);

  const OpRecord& use = trace->records[5];
  EXPECT_EQ(use.kind, OpKind::kUse);
  EXPECT_THAT(use.inputs, ElementsAre(T(*trace, "x1"), T(*trace, "v1")));
  EXPECT_TRUE(use.outputs.empty());

  // The same op name is interned once; a tensor may be read twice by one call.
  const OpRecord& mm2 = trace->records[7];
  EXPECT_EQ(mm2.name, mm.name);
  EXPECT_THAT(mm2.inputs, ElementsAre(T(*trace, "x1"), T(*trace, "x1")));
  EXPECT_THAT(mm2.outputs, ElementsAre(T(*trace, "g"), T(*trace, "h")));

  const OpRecord& release = trace->records[8];
  EXPECT_EQ(release.kind, OpKind::kRelease);
  EXPECT_THAT(release.inputs, ElementsAre(T(*trace, "x1")));

  EXPECT_EQ(trace->calls, 3u);
  EXPECT_EQ(trace->constants, 2u);
  EXPECT_EQ(trace->views, 1u);
  EXPECT_EQ(trace->total_cost_ns, 52007u);
  EXPECT_EQ(trace->constant_bytes, 5120u);
  EXPECT_EQ(trace->peak_live_bytes, 5120 + kMiB + 24);
  EXPECT_EQ(trace->peak_record, 7u);
  // x1's storage outlives its release while the view v1 lives.
  EXPECT_EQ(trace->live_bytes_at_end, 5120 + kMiB + 24);
}

TEST(OpTraceTest, TheLeastBudgetCountsAViewOutputNotItsBase) {
  // `v` views `a`, which the call does not read: it needs only `b` and `out`.
  absl::StatusOr<OpTrace> trace = ParseOpTrace(
      R"({"op":"call","name":"make","inputs":[],"outputs":[{"id":"a","bytes":1000}],"cost_ns":1}
{"op":"call","name":"make","inputs":[],"outputs":[{"id":"b","bytes":10}],"cost_ns":1}
{"op":"call","name":"f","inputs":["b"],"outputs":[{"id":"out","bytes":20},{"id":"v","alias_of":"a"}],"cost_ns":1}
)",
      "v.jsonl");
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->least_budget_bytes, 1000u);  // `make` of a sets it; f needs 30
  EXPECT_EQ(trace->least_budget_record, 0u);
}

TEST(OpTraceTest, KindNamesAreTheOpSpellings) {
  EXPECT_EQ(OpKindName(OpKind::kConstant), "constant");
  EXPECT_EQ(OpKindName(OpKind::kCall), "call");
  EXPECT_EQ(OpKindName(OpKind::kUse), "use");
  EXPECT_EQ(OpKindName(OpKind::kRelease), "release");
  EXPECT_EQ(OpKindName(OpKind::kPhase), "phase");
  EXPECT_EQ(OpKindName(OpKind::kEvict), "evict");
  EXPECT_EQ(OpKindName(OpKind::kPrefetch), "prefetch");
}

TEST(OpTraceTest, EvictAndPrefetchRecordsNameALiveTensor) {
  absl::StatusOr<OpTrace> trace = ParseOpTrace(
      R"({"op":"constant","id":"w","bytes":8}
{"op":"call","name":"mm","inputs":["w"],"outputs":[{"id":"x","bytes":16}],"cost_ns":5}
{"op":"call","name":"view","inputs":["x"],"outputs":[{"id":"v","alias_of":"x"}],"cost_ns":0}
{"op":"evict","id":"v","action":"offload"}
{"op":"prefetch","id":"x"}
{"op":"evict","id":"x","action":"drop"}
{"op":"use","ids":["x"]}
)",
      "e.jsonl");
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->records.size(), 7u);
  const OpRecord& offload = trace->records[3];
  EXPECT_EQ(offload.kind, OpKind::kEvict);
  EXPECT_TRUE(offload.offload);
  ASSERT_EQ(offload.inputs.size(), 1u);
  EXPECT_EQ(trace->tensors[offload.inputs[0]].id, "v");
  EXPECT_EQ(trace->records[4].kind, OpKind::kPrefetch);
  EXPECT_EQ(trace->records[5].kind, OpKind::kEvict);
  EXPECT_FALSE(trace->records[5].offload);
  EXPECT_EQ(trace->evicts, 2u);
  EXPECT_EQ(trace->prefetches, 1u);
  // They change no figure of the trace as written.
  EXPECT_EQ(trace->calls, 2u);
  EXPECT_EQ(trace->peak_live_bytes, 24u);
}

TEST(OpTraceTest, ViewsOfViewsShareTheRootStorage) {
  absl::StatusOr<OpTrace> trace = ParseOpTrace(
      R"({"op":"constant","id":"x","bytes":100}
{"op":"call","name":"f","inputs":["x"],"outputs":[{"id":"a","bytes":1000}],"cost_ns":1}
{"op":"call","name":"view","inputs":["a"],"outputs":[{"id":"b","alias_of":"a","bytes":5}],"cost_ns":0}
{"op":"call","name":"view","inputs":["b"],"outputs":[{"id":"c","alias_of":"b"}],"cost_ns":0}
{"op":"release","id":"a"}
{"op":"release","id":"b"}
{"op":"use","ids":["c"]}
{"op":"release","id":"c"}
{"op":"call","name":"split","inputs":["x"],"outputs":[{"id":"d","bytes":10},{"id":"e","alias_of":"d"}],"cost_ns":1}
)",
      "t.jsonl");
  ASSERT_TRUE(trace.ok()) << trace.status();
  const std::uint32_t a = T(*trace, "a"), b = T(*trace, "b"), c = T(*trace, "c");
  EXPECT_EQ(trace->tensors[b].storage, a);
  EXPECT_EQ(trace->tensors[b].alias_of, a);
  EXPECT_EQ(trace->tensors[b].bytes, 0u);  // a view's `bytes` is ignored
  EXPECT_EQ(trace->tensors[c].storage, a);
  EXPECT_EQ(trace->tensors[c].alias_of, b);
  // A view may alias an earlier output of its own call.
  EXPECT_EQ(trace->tensors[T(*trace, "e")].storage, T(*trace, "d"));
  EXPECT_EQ(trace->views, 3u);
  // Views add no bytes, and a's storage lives until c, its last view, goes.
  EXPECT_EQ(trace->peak_live_bytes, 1100u);
  EXPECT_EQ(trace->peak_record, 1u);
  EXPECT_EQ(trace->live_bytes_at_end, 110u);
}

TEST(OpTraceTest, ZeroByteTensorsAndReleasedConstants) {
  absl::StatusOr<OpTrace> trace = ParseOpTrace(
      R"({"op":"constant","id":"seed","bytes":0}
{"op":"call","name":"empty","inputs":["seed"],"outputs":[{"id":"z","bytes":0}],"cost_ns":0}
{"op":"call","name":"zeros","inputs":[],"outputs":[{"id":"y","bytes":0}],"cost_ns":3}
{"op":"release","id":"seed"}
{"op":"use","ids":[]}
{"op":"release","id":"z"}
)",
      "t.jsonl");
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->tensors[T(*trace, "z")].bytes, 0u);
  EXPECT_TRUE(trace->records[2].inputs.empty());
  EXPECT_EQ(trace->tensors[T(*trace, "seed")].released_by, 3u);
  EXPECT_EQ(trace->peak_live_bytes, 0u);
  EXPECT_EQ(trace->peak_record, kNoOpIndex);  // never above zero
  EXPECT_EQ(trace->live_bytes_at_end, 0u);
}

TEST(OpTraceTest, UnknownFieldsAreIgnored) {
  absl::StatusOr<OpTrace> trace = ParseOpTrace(
      R"({"op":"constant","id":"w","bytes":8,"dtype":"fp16","shape":[2,2],"meta":{"x":[1,{"y":null}]}}
{"stream":3,"op":"call","name":"f","inputs":["w"],"outputs":[{"id":"x","bytes":4,"shape":[1]}],"cost_ns":2,"flops":1e9}
{"op":"phase","name":"backward","step":1}
{"op":"release","id":"x","why":"done"}
{"op":"use","ids":["w"],"note":true}
)",
      "t.jsonl");
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->records.size(), 5u);
  EXPECT_EQ(trace->peak_live_bytes, 12u);
}

TEST(OpTraceTest, AcceptsBlankLinesCrlfAndBom) {
  absl::StatusOr<OpTrace> trace = ParseOpTrace(
      "\xEF\xBB\xBF{\"op\":\"constant\",\"id\":\"w\",\"bytes\":8}\r\n"
      "\r\n"
      "   \n"
      "\n"
      "  {\"op\":\"release\",\"id\":\"w\"}  ",
      "t.jsonl");
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->records.size(), 2u);
  EXPECT_EQ(trace->records[0].line, 1u);
  EXPECT_EQ(trace->records[1].line, 5u);

  absl::StatusOr<OpTrace> empty = ParseOpTrace("\n\n", "t.jsonl");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->records.empty());
}

// A small training step whose peak is worked out by hand.
TEST(OpTraceTest, PeakLiveBytesIsExact) {
  absl::StatusOr<OpTrace> trace = ParseOpTrace(
      R"({"op":"constant","id":"x0","bytes":100}
{"op":"constant","id":"w","bytes":10}
{"op":"phase","name":"forward"}
{"op":"call","name":"f","inputs":["w","x0"],"outputs":[{"id":"x1","bytes":1000}],"cost_ns":5}
{"op":"call","name":"f","inputs":["w","x1"],"outputs":[{"id":"x2","bytes":1000}],"cost_ns":5}
{"op":"call","name":"tmp","inputs":["x2"],"outputs":[{"id":"t","bytes":3000}],"cost_ns":1}
{"op":"call","name":"f","inputs":["t"],"outputs":[{"id":"x3","bytes":1000}],"cost_ns":5}
{"op":"release","id":"t"}
{"op":"call","name":"loss","inputs":["x3"],"outputs":[{"id":"l","bytes":4}],"cost_ns":1}
{"op":"phase","name":"backward"}
{"op":"call","name":"df","inputs":["l","x3"],"outputs":[{"id":"g3","bytes":1000}],"cost_ns":10}
{"op":"release","id":"x3"}
{"op":"release","id":"l"}
{"op":"call","name":"df","inputs":["g3","x2"],"outputs":[{"id":"g2","bytes":1000},{"id":"dw2","bytes":10}],"cost_ns":10}
{"op":"release","id":"g3"}
{"op":"release","id":"x2"}
{"op":"call","name":"df","inputs":["g2","x1"],"outputs":[{"id":"g1","bytes":1000},{"id":"dw1","bytes":10}],"cost_ns":10}
{"op":"release","id":"g2"}
{"op":"release","id":"x1"}
{"op":"release","id":"g1"}
)",
      "t.jsonl");
  ASSERT_TRUE(trace.ok()) << trace.status();
  // Live after each record: 100, 110, 110, 1110, 2110, 5110 (x1 x2 t), 6110
  // (x1 x2 t x3: the peak), 3110, 3114, 3114, 4114, 3114, 3110, 4120, 3120,
  // 2120, 3130, 2130, 1130, 130.
  EXPECT_EQ(trace->peak_live_bytes, 6110u);
  EXPECT_EQ(trace->peak_record, 6u);
  EXPECT_EQ(trace->live_bytes_at_end, 130u);
  EXPECT_EQ(trace->total_cost_ns, 47u);
  EXPECT_EQ(trace->calls, 8u);
  EXPECT_EQ(trace->constants, 2u);
  EXPECT_EQ(trace->constant_bytes, 110u);
  // A call's inputs and outputs at once, with the constants (110): tmp reads
  // x2 and makes t (4000), as does f reading t and making x3; tmp comes first.
  EXPECT_EQ(trace->least_budget_bytes, 4110u);
  EXPECT_EQ(trace->least_budget_record, 5u);
}

TEST(OpTraceTest, ErrorsNameTheTraceAndLine) {
  const std::string kHead = R"({"op":"constant","id":"w","bytes":8}
{"op":"call","name":"mm","inputs":["w"],"outputs":[{"id":"x1","bytes":8}],"cost_ns":1}
)";  // lines 1-2; each case below is line 3 or later
  struct Case {
    const char* what;
    std::string body;
    std::string message;
  };
  const Case cases[] = {
      {"bad JSON", R"({"op":"constant","id":"a","bytes":8)", "t.jsonl:3: bad JSON: "},
      {"trailing garbage", R"({"op":"use","ids":[]} x)", "t.jsonl:3: bad JSON: "},
      {"not an object", R"(["op","use"])",
       "t.jsonl:3: expected a JSON object, found [\"op\",\"use\"]"},
      {"missing op", R"({"id":"a","bytes":8})", "t.jsonl:3: missing 'op'"},
      {"op not a string", R"({"op":1})", "t.jsonl:3: 'op' must be a string, found 1"},
      {"unknown op", R"({"op":"free","id":"w"})",
       "t.jsonl:3: unknown op 'free' (expected constant, call, use, release, phase, evict or "
       "prefetch)"},
      {"unknown id",
       R"({"op":"call","name":"mm","inputs":["w","x9"],"outputs":[{"id":"y","bytes":1}],"cost_ns":1})",
       "t.jsonl:3: call 'mm' reads 'x9', which no earlier line defines"},
      {"released id",
       "{\"op\":\"release\",\"id\":\"x1\"}\n\n"
       R"({"op":"call","name":"mm","inputs":["x1"],"outputs":[{"id":"y","bytes":1}],"cost_ns":1})",
       "t.jsonl:5: call 'mm' reads 'x1', which was released at line 3"},
      {"use of released",
       "{\"op\":\"release\",\"id\":\"w\"}\n{\"op\":\"use\",\"ids\":[\"x1\",\"w\"]}",
       "t.jsonl:4: use of 'w', which was released at line 3"},
      {"release twice", "{\"op\":\"release\",\"id\":\"w\"}\n{\"op\":\"release\",\"id\":\"w\"}",
       "t.jsonl:4: release of 'w', which was released at line 3"},
      {"release unknown", R"({"op":"release","id":"nope"})",
       "t.jsonl:3: release of 'nope', which no earlier line defines"},
      {"duplicate id",
       R"({"op":"call","name":"add","inputs":["x1"],"outputs":[{"id":"x1","bytes":8}],"cost_ns":1})",
       "t.jsonl:3: call 'add' defines 'x1', which was already defined at line 2"},
      {"duplicate constant", R"({"op":"constant","id":"w","bytes":8})",
       "t.jsonl:3: constant defines 'w', which was already defined at line 1"},
      {"duplicate after release",
       "{\"op\":\"release\",\"id\":\"x1\"}\n"
       R"({"op":"constant","id":"x1","bytes":8})",
       "t.jsonl:4: constant defines 'x1', which was already defined at line 2"},
      {"duplicate within a call",
       R"({"op":"call","name":"f","inputs":[],"outputs":[{"id":"a","bytes":1},{"id":"a","bytes":1}],"cost_ns":1})",
       "t.jsonl:3: call 'f' defines 'a', which was already defined at line 3"},
      {"alias_of unknown",
       R"({"op":"call","name":"view","inputs":["x1"],"outputs":[{"id":"v","alias_of":"x2"}],"cost_ns":0})",
       "t.jsonl:3: call 'view' output 'v' is a view of 'x2', which no earlier line defines"},
      {"alias_of released",
       "{\"op\":\"release\",\"id\":\"x1\"}\n"
       R"({"op":"call","name":"view","inputs":["w"],"outputs":[{"id":"v","alias_of":"x1"}],"cost_ns":0})",
       "t.jsonl:4: call 'view' output 'v' is a view of 'x1', which was released at line 3"},
      {"alias_of not a string",
       R"({"op":"call","name":"view","inputs":["x1"],"outputs":[{"id":"v","alias_of":3}],"cost_ns":0})",
       "t.jsonl:3: call 'view' output 'v': 'alias_of' must be a string, found 3"},
      {"negative bytes", R"({"op":"constant","id":"a","bytes":-5})",
       "t.jsonl:3: constant 'a': 'bytes' must be a non-negative integer, found -5"},
      {"negative output bytes",
       R"({"op":"call","name":"f","inputs":[],"outputs":[{"id":"a","bytes":-1}],"cost_ns":1})",
       "t.jsonl:3: call 'f' output 'a': 'bytes' must be a non-negative integer, found -1"},
      {"fractional bytes", R"({"op":"constant","id":"a","bytes":4096.0})",
       "t.jsonl:3: constant 'a': 'bytes' must be a non-negative integer, found 4096.0"},
      {"bytes as text", R"({"op":"constant","id":"a","bytes":"8"})",
       "t.jsonl:3: constant 'a': 'bytes' must be a non-negative integer, found \"8\""},
      {"non-integer cost",
       R"({"op":"call","name":"f","inputs":[],"outputs":[{"id":"a","bytes":1}],"cost_ns":1.5})",
       "t.jsonl:3: call 'f': 'cost_ns' must be a non-negative integer below 2^63, found 1.5"},
      {"negative cost",
       R"({"op":"call","name":"f","inputs":[],"outputs":[{"id":"a","bytes":1}],"cost_ns":-1})",
       "t.jsonl:3: call 'f': 'cost_ns' must be a non-negative integer below 2^63, found -1"},
      {"huge cost",
       R"({"op":"call","name":"f","inputs":[],"outputs":[{"id":"a","bytes":1}],"cost_ns":9223372036854775808})",
       "t.jsonl:3: call 'f': 'cost_ns' must be a non-negative integer below 2^63"},
      {"call without outputs",
       R"({"op":"call","name":"f","inputs":["w"],"outputs":[],"cost_ns":1})",
       "t.jsonl:3: call 'f' has no outputs"},
      {"input id not a string",
       R"({"op":"call","name":"f","inputs":["w",7],"outputs":[{"id":"a","bytes":1}],"cost_ns":1})",
       "t.jsonl:3: call 'f': inputs[1] must be a string, found 7"},
      {"use id not a string", R"({"op":"use","ids":[null]})",
       "t.jsonl:3: use: ids[0] must be a string, found null"},
      {"output id not a string",
       R"({"op":"call","name":"f","inputs":[],"outputs":[{"id":["a"],"bytes":1}],"cost_ns":1})",
       "t.jsonl:3: call 'f': outputs[0]: 'id' must be a non-empty string, found [\"a\"]"},
      {"release id not a string", R"({"op":"release","id":1})",
       "t.jsonl:3: release: 'id' must be a string, found 1"},
      {"constant id not a string", R"({"op":"constant","id":false,"bytes":1})",
       "t.jsonl:3: constant: 'id' must be a non-empty string, found false"},
      {"empty id", R"({"op":"constant","id":"","bytes":1})",
       "t.jsonl:3: constant defines an empty id"},
      {"output not an object",
       R"({"op":"call","name":"f","inputs":[],"outputs":["a"],"cost_ns":1})",
       "t.jsonl:3: call 'f': outputs[0] must be an object, found \"a\""},
      {"output without bytes",
       R"({"op":"call","name":"f","inputs":[],"outputs":[{"id":"a"}],"cost_ns":1})",
       "t.jsonl:3: call 'f' output 'a': missing 'bytes' (or 'alias_of' for a view)"},
      {"constant without bytes", R"({"op":"constant","id":"a"})",
       "t.jsonl:3: constant 'a': missing 'bytes'"},
      {"constant without id", R"({"op":"constant","bytes":1})",
       "t.jsonl:3: constant: missing 'id'"},
      {"call without name",
       R"({"op":"call","inputs":[],"outputs":[{"id":"a","bytes":1}],"cost_ns":1})",
       "t.jsonl:3: call: missing 'name'"},
      {"call without inputs",
       R"({"op":"call","name":"f","outputs":[{"id":"a","bytes":1}],"cost_ns":1})",
       "t.jsonl:3: call 'f': missing 'inputs'"},
      {"call without outputs field", R"({"op":"call","name":"f","inputs":[],"cost_ns":1})",
       "t.jsonl:3: call 'f': missing 'outputs'"},
      {"call without cost",
       R"({"op":"call","name":"f","inputs":[],"outputs":[{"id":"a","bytes":1}]})",
       "t.jsonl:3: call 'f': missing 'cost_ns'"},
      {"inputs not an array",
       R"({"op":"call","name":"f","inputs":"w","outputs":[{"id":"a","bytes":1}],"cost_ns":1})",
       "t.jsonl:3: call 'f': 'inputs' must be an array, found \"w\""},
      {"use without ids", R"({"op":"use"})", "t.jsonl:3: use: missing 'ids'"},
      {"release without id", R"({"op":"release"})", "t.jsonl:3: release: missing 'id'"},
      {"phase without name", R"({"op":"phase"})", "t.jsonl:3: phase: missing 'name'"},
      {"evict without action", R"({"op":"evict","id":"x1"})", "t.jsonl:3: evict: missing 'action'"},
      {"evict without id", R"({"op":"evict","action":"drop"})", "t.jsonl:3: evict: missing 'id'"},
      {"evict by an unknown action", R"({"op":"evict","id":"x1","action":"burn"})",
       "t.jsonl:3: evict: action 'burn' (expected drop or offload)"},
      {"evict of a constant", R"({"op":"evict","id":"w","action":"offload"})",
       "t.jsonl:3: evict of 'w', a constant (constants stay on the device)"},
      {"evict of a released tensor",
       "{\"op\":\"release\",\"id\":\"x1\"}\n{\"op\":\"evict\",\"id\":\"x1\",\"action\":\"drop\"}",
       "t.jsonl:4: evict of 'x1', which was released at line 3"},
      {"evict of a view of a constant",
       "{\"op\":\"call\",\"name\":\"t\",\"inputs\":[\"w\"],\"outputs\":[{\"id\":\"wt\","
       "\"alias_of\":\"w\"}],\"cost_ns\":0}\n{\"op\":\"evict\",\"id\":\"wt\",\"action\":\"drop\"}",
       "t.jsonl:4: evict of 'wt', a view of a constant (constants stay on the device)"},
      {"prefetch of an unknown tensor", R"({"op":"prefetch","id":"x7"})",
       "t.jsonl:3: prefetch of 'x7', which no earlier line defines"},
      {"prefetch id not a string", R"({"op":"prefetch","id":7})",
       "t.jsonl:3: prefetch: 'id' must be a string, found 7"},
      {"phase name not a string", R"({"op":"phase","name":2})",
       "t.jsonl:3: phase: 'name' must be a string, found 2"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    EXPECT_THAT(ErrorOf(kHead + c.body), StartsWith(c.message));
  }
}

TEST(OpTraceTest, LongValuesAreCutShortInMessages) {
  const std::string id(100, 'q');
  const std::string message = ErrorOf(R"({"op":"release","id":")" + id + R"("})");
  EXPECT_THAT(message, HasSubstr("release of '" + std::string(40, 'q') + "...'"));
  EXPECT_LT(message.size(), 120u);
}

TEST(OpTraceTest, LivenessOverflowIsAnError) {
  EXPECT_THAT(ErrorOf(R"({"op":"constant","id":"a","bytes":18446744073709551615}
{"op":"constant","id":"b","bytes":1})"),
              StartsWith("t.jsonl:2: constant defines 'b': the live bytes pass 2^64"));
}

TEST(OpTraceTest, ATotalCostPast2To62IsAnError) {
  // A replay adds recomputes to it on a signed 64-bit clock (a fuzzer's
  // trace of two calls of 5.4e18 ns each overflowed it).
  EXPECT_THAT(ErrorOf(R"({"op":"call","name":"f","inputs":[],"outputs":[{"id":"a","bytes":1}],"cost_ns":3000000000000000000}
{"op":"call","name":"g","inputs":[],"outputs":[{"id":"b","bytes":1}],"cost_ns":3000000000000000000})"),
              StartsWith("t.jsonl:2: call 'g': the total cost passes 2^62 ns"));
}

TEST(OpTraceTest, ReadMissingFileIsNotFound) {
  absl::StatusOr<OpTrace> trace = ReadOpTrace("/nonexistent/trace.jsonl");
  EXPECT_TRUE(absl::IsNotFound(trace.status())) << trace.status();
  EXPECT_THAT(trace.status().message(), HasSubstr("/nonexistent/trace.jsonl"));
}


TEST(OpTraceTest, ShippedChainParses) {
  const std::string path = std::string(REMAT_EXAMPLE_TRACES_DIR) + "/chain_100.jsonl";
  absl::StatusOr<OpTrace> trace = ReadOpTrace(path);
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->name, path);
  // 100 layers forward, a loss, its gradient, 100 layers backward.
  EXPECT_EQ(trace->calls, 202u);
  EXPECT_EQ(trace->constants, 101u);  // the input and 100 weights
  EXPECT_EQ(trace->total_cost_ns, 100 * 50000u + 5000 + 5000 + 100 * 100000u);
  // At the last layer's backward: the input, 100 activations and 100 weights
  // (504 MiB), the gradient it reads and the two it writes (4 + 4 + 1 MiB).
  // scripts/make_op_traces.py works it out too, as examples/traces/README.md says.
  EXPECT_EQ(trace->peak_live_bytes, 509 * kMiB);
  EXPECT_EQ(trace->live_bytes_at_end, 100 * kMiB);  // the weights
  EXPECT_THAT(trace->names, ::testing::Contains("backward"));
}

TEST(OpTraceTest, ShippedTransformerParses) {
  const std::string path = std::string(REMAT_EXAMPLE_TRACES_DIR) + "/transformer_small.jsonl";
  absl::StatusOr<OpTrace> trace = ReadOpTrace(path);
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_GT(trace->records.size(), 1000u);
  EXPECT_GT(trace->views, 0u);
  EXPECT_THAT(trace->names, ::testing::IsSupersetOf({"forward", "backward"}));
  // As scripts/make_op_traces.py works it out (examples/traces/README.md).
  EXPECT_EQ(trace->peak_live_bytes, 374882304u);
  // Parameters and the causal mask; the batches and gradients are released.
  EXPECT_EQ(trace->live_bytes_at_end, 34396160u);
}

}  // namespace
}  // namespace remat

namespace remat {
namespace {

// Reading a file streams it; parsing text in memory must give the same trace.
TEST(OpTraceTest, ReadingAFileMatchesParsingItsText) {
  for (const char* name : {"chain_100.jsonl", "transformer_small.jsonl", "densenet121_b8.jsonl",
                           "lstm_l2_h512_s128_b32_v256.jsonl"}) {
    const std::string path = std::string(REMAT_EXAMPLE_TRACES_DIR) + "/" + name;
    std::ifstream in(path, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    absl::StatusOr<OpTrace> read = ReadOpTrace(path);
    absl::StatusOr<OpTrace> parsed = ParseOpTrace(text.str(), path);
    ASSERT_TRUE(read.ok()) << read.status();
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    ASSERT_EQ(read->records.size(), parsed->records.size()) << name;
    for (std::size_t i = 0; i < read->records.size(); ++i) {
      const OpRecord& a = read->records[i];
      const OpRecord& b = parsed->records[i];
      ASSERT_TRUE(a.kind == b.kind && a.line == b.line && a.name == b.name &&
                  a.cost_ns == b.cost_ns && a.inputs == b.inputs && a.outputs == b.outputs)
          << name << " record " << i;
    }
    ASSERT_EQ(read->tensors.size(), parsed->tensors.size());
    EXPECT_EQ(read->names, parsed->names);
    EXPECT_EQ(read->peak_live_bytes, parsed->peak_live_bytes);
    EXPECT_EQ(read->least_budget_bytes, parsed->least_budget_bytes);
  }
}

// A bad first line is reported without reading the rest of the file: fed
// through a pipe whose writer offers 8 MiB after it, the reader goes away
// after line 1 and the writer's next write fails (reading the whole file
// first would take all 8 MiB).
TEST(OpTraceTest, ABadFirstLineIsReportedBeforeTheRestIsRead) {
  FifoFeeder feeder(::testing::TempDir() + "/bad_first_line.fifo", "not json\n", '\n');
  ASSERT_TRUE(feeder.ok());
  absl::StatusOr<OpTrace> trace = ReadOpTrace(feeder.path());
  ASSERT_FALSE(trace.ok());
  EXPECT_THAT(std::string(trace.status().message()), ::testing::HasSubstr(feeder.path() + ":1:"));
  EXPECT_TRUE(feeder.WriterWasCutOff());
}

}  // namespace
}  // namespace remat
