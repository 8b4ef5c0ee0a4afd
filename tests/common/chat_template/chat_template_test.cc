// The chat template interpreter against real models' templates, with the expected prompts
// written out by hand from reading each template (and Jinja2's trim_blocks/lstrip_blocks rules,
// which Hugging Face's apply_chat_template uses).

#include "common/chat_template/chat_template.h"

#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace kvserve {
namespace {

using nlohmann::json;

constexpr char kTokenizers[] = KVSERVE_SHARED_DIR "/models/tokenizers";

json ReadConfig(const std::string& model) {
  std::ifstream in(std::string(kTokenizers) + "/" + model + "/tokenizer_config.json");
  std::stringstream text;
  text << in.rdbuf();
  return json::parse(text.str());
}

std::string RenderOrDie(const std::string& source, const json& messages,
                        const ChatRenderOptions& options = {}) {
  absl::StatusOr<ChatTemplate> tmpl = ChatTemplate::Parse(source);
  EXPECT_TRUE(tmpl.ok()) << tmpl.status();
  if (!tmpl.ok()) return "";
  absl::StatusOr<std::string> out = tmpl->Render(messages, options);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : "";
}

absl::Status RenderError(const std::string& source, const json& messages) {
  absl::StatusOr<ChatTemplate> tmpl = ChatTemplate::Parse(source);
  if (!tmpl.ok()) return tmpl.status();
  return tmpl->Render(messages, {}).status();
}

ChatRenderOptions Llama(bool generation_prompt) {
  ChatRenderOptions options;
  options.add_generation_prompt = generation_prompt;
  options.bos_token = "<s>";
  options.eos_token = "</s>";
  return options;
}

TEST(ChatTemplateTest, TinyLlamaZephyrTemplate) {
  const json config = ReadConfig("tinyllama-1.1b-chat-v1.0");
  const std::string source = config.at("chat_template").get<std::string>();
  const json messages = json::array(
      {{{"role", "system"},
        {"content", "You are a friendly chatbot who always responds in the style of a pirate"}},
       {{"role", "user"}, {"content", "How many helicopters can a human eat in one sitting?"}}});
  // The newline after each block tag is dropped (trim_blocks); the one after each {{ }} stays.
  EXPECT_EQ(RenderOrDie(source, messages, Llama(true)),
            "<|system|>\nYou are a friendly chatbot who always responds in the style of a "
            "pirate</s>\n<|user|>\nHow many helicopters can a human eat in one sitting?</s>\n"
            "<|assistant|>\n");
  const json turns = json::parse(R"([
    {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}])");
  EXPECT_EQ(RenderOrDie(source, turns, Llama(false)),
            "<|user|>\nHi</s>\n<|assistant|>\nHello!</s>\n");
  // A role the template does not know produces nothing.
  EXPECT_EQ(RenderOrDie(source, json::parse(R"([{"role": "tool", "content": "x"}])"), Llama(false)),
            "");
}

// SmolLM2-Instruct's ChatML template (the shared SmolLM2-135M base config has none).
constexpr char kSmolLmChatMl[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}";

TEST(ChatTemplateTest, SmolLm2ChatMl) {
  EXPECT_EQ(ReadConfig("smollm2-135m").count("chat_template"), 0u);
  ChatRenderOptions options;
  options.bos_token = options.eos_token = "<|endoftext|>";
  EXPECT_EQ(
      RenderOrDie(kSmolLmChatMl, json::parse(R"([{"role": "user", "content": "Hi"}])"), options),
      "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
      "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  options.add_generation_prompt = false;
  EXPECT_EQ(RenderOrDie(kSmolLmChatMl, json::parse(R"([
              {"role": "system", "content": "Be brief."},
              {"role": "user", "content": "2+2?"},
              {"role": "assistant", "content": "4"}])"),
                        options),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
            "<|im_start|>assistant\n4<|im_end|>\n");
}

// Llama-2-chat style: role alternation enforced with raise_exception, .strip(), bos_token.
constexpr char kLlama2[] =
    "{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + message['content'].strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}"
    "{{ ' '  + message['content'].strip() + ' ' + eos_token }}"
    "{% endif %}{% endfor %}";

TEST(ChatTemplateTest, RaiseExceptionAndMethods) {
  EXPECT_EQ(RenderOrDie(kLlama2, json::parse(R"([
              {"role": "user", "content": " Hi "}, {"role": "assistant", "content": "Hello\n"},
              {"role": "user", "content": "Bye"}])"),
                        Llama(true)),
            "<s>[INST] Hi [/INST] Hello </s><s>[INST] Bye [/INST]");
  absl::Status status = RenderError(kLlama2, json::parse(R"([
      {"role": "user", "content": "a"}, {"role": "user", "content": "b"}])"));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("Conversation roles must alternate"), std::string::npos)
      << status;
}

TEST(ChatTemplateTest, WhitespaceControl) {
  const json none = json::array();
  // '-' strips all whitespace on its side; lstrip_blocks drops the indentation before a tag.
  EXPECT_EQ(RenderOrDie("a  {{- 'b' -}}  c", none), "abc");
  EXPECT_EQ(RenderOrDie("x\n    {% if true %}\n    y\n    {% endif %}\nz", none), "x\n    y\nz");
  EXPECT_EQ(RenderOrDie("a {% if true %}b{% endif %} c", none), "a b c");
  EXPECT_EQ(RenderOrDie("a\n{%- if true %}b{% endif -%}\n\nc", none), "abc");
  EXPECT_EQ(RenderOrDie("{# note #}\nv{{ 1 }}\n", none), "v1\n");
  // '+' keeps the newline that trim_blocks would drop.
  EXPECT_EQ(RenderOrDie("{% if true +%}\nk{% endif %}", none), "\nk");
}

TEST(ChatTemplateTest, ExpressionsFiltersAndLoops) {
  const json messages = json::parse(R"([{"role": "user", "content": "  Hello  "},
                                        {"role": "assistant", "content": "Yo"}])");
  EXPECT_EQ(RenderOrDie("{% for m in messages %}{{ loop.index }}/{{ loop.length }}"
                        "{{ '*' if loop.first }}{{ '!' if loop.last else ',' }}{% endfor %}",
                        messages),
            "1/2*,2/2!");
  EXPECT_EQ(RenderOrDie("[{{ messages[0].content | trim | upper }}]"
                        "{{ messages | length }}{{ messages[-1]['content'] | lower }}",
                        messages),
            "[HELLO]2yo");
  EXPECT_EQ(RenderOrDie("{{ 'a' ~ 1 ~ none }}|{{ 7 // 2 }}{{ -7 % 3 }}{{ 1 / 4 }}|"
                        "{{ 'ell' in 'hello' }}{{ 'z' not in ['a', 'b'] }}{{ 2 >= 3 or not 0 }}",
                        json::array()),
            "a1None|320.25|TrueTrueTrue");
  // set inside a loop stays in the loop; set outside is global.
  EXPECT_EQ(RenderOrDie("{% set x = 'out' %}{% for m in messages %}{% set x = m.role %}"
                        "{{ x }},{% endfor %}{{ x }}",
                        messages),
            "user,assistant,out");
  // Loop filter, else branch, slices, dict items, tests.
  EXPECT_EQ(RenderOrDie("{% for m in messages if m.role == 'assistant' %}{{ loop.index }}"
                        "{{ m.content }}{% endfor %}{% for m in [] %}x{% else %}empty{% endfor %}"
                        "{{ messages[1:] | length }}{{ 'abc'[::-1] }}"
                        "{% for k, v in {'a': 1}.items() %}{{ k }}={{ v }}{% endfor %}"
                        "{{ foo is defined }}{{ messages[0].name is none }}{{ 3 is number }}",
                        messages),
            "1Yoempty1cbaa=1FalseFalseTrue");
  EXPECT_EQ(RenderOrDie("{{ undefined_var }}|{{ [1, 'a'] }}|{{ messages[5] }}", messages),
            "|[1, 'a']|");
}

TEST(ChatTemplateTest, UnsupportedSyntaxFailsAtLoad) {
  struct Case {
    const char* source;
    const char* expected;
  };
  const Case cases[] = {
      {"{% macro f() %}x{% endmacro %}", "unsupported statement 'macro'"},
      {"{{ messages | dictsort }}", "unsupported filter 'dictsort'"},
      {"{{ range(3) }}", "unsupported function 'range'"},
      {"{{ x is divisibleby(3) }}", "unsupported test 'divisibleby'"},
      {"{% if x %}open", "missing {% endif %}"},
      {"{{ 'unterminated }}", "unterminated string"},
      {"a\n{% endfor %}", "line 2: unexpected {% endfor %}"},
      {"{{ x.format() }}", "unsupported method 'format'"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<ChatTemplate> tmpl = ChatTemplate::Parse(c.source);
    ASSERT_FALSE(tmpl.ok()) << c.source;
    EXPECT_EQ(tmpl.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(tmpl.status().message().find(c.expected), std::string::npos)
        << c.source << " -> " << tmpl.status();
    EXPECT_NE(tmpl.status().message().find("chat_template: line "), std::string::npos);
  }
}

TEST(ChatTemplateTest, RenderErrorsAreClear) {
  absl::Status status = RenderError("{{ nothing.content }}", json::array());
  EXPECT_NE(status.message().find("'nothing' is undefined"), std::string::npos) << status;
  status = RenderError("{{ messages[0].content + 1 }}",
                       json::parse(R"([{"role": "user", "content": "x"}])"));
  // Python's wording, as the reference renderer raises it.
  EXPECT_NE(status.message().find("can only concatenate str (not \"int\") to str"),
            std::string::npos)
      << status;
  status = RenderError("{{ 1 + 'a' }}", json::array());
  EXPECT_NE(status.message().find("unsupported operand type(s) for +: 'int' and 'str'"),
            std::string::npos)
      << status;
  status = RenderError("{% set ns = 1 %}{% set ns.x = 2 %}", json::array());
  EXPECT_NE(status.message().find("cannot assign attribute on non-namespace object 'ns'"),
            std::string::npos)
      << status;
  status = RenderError("{{ 'a' | upper(x=1) }}", json::array());
  EXPECT_NE(status.message().find("'upper' got an unexpected keyword argument 'x'"),
            std::string::npos)
      << status;
  status = RenderError("{{ 1 }}", json::parse(R"({"role": "user"})"));
  EXPECT_NE(status.message().find("messages: expected an array"), std::string::npos) << status;
  status = RenderError("{{ 1 }}", json::parse(R"(["hi"])"));
  EXPECT_NE(status.message().find("messages[0]: expected an object"), std::string::npos);
  status = RenderError("{{ raise_exception('nope') }}", json::array());
  EXPECT_EQ(status.message(), "chat_template: raise_exception: nope");
}

// Expected strings from Python 3.11: json.dumps(v, ensure_ascii=False[, indent=2][,
// sort_keys=True]) and datetime(2026, 7, 26).strftime(...), as Hugging Face's renderer calls them.
TEST(ChatTemplateTest, ToJsonNamespaceAndStrftimeAsHuggingFaceRendersThem) {
  const std::string value = R"({% set v = {'b': [1, 2.5, none, true, 0.00001], 'a': 'x"\n)"
                            "\x01"
                            R"(é/', 'e': {}, 'l': []} %})";
  ChatRenderOptions options;
  options.date = absl::CivilDay(2026, 7, 26);
  EXPECT_EQ(RenderOrDie(value + "{{ v | tojson }}", json::array(), options),
            "{\"b\": [1, 2.5, null, true, 1e-05], \"a\": \"x\\\"\\n\\u0001é/\", \"e\": {}, "
            "\"l\": []}");
  EXPECT_EQ(RenderOrDie(value + "{{ v | tojson(indent=2) }}", json::array(), options),
            "{\n  \"b\": [\n    1,\n    2.5,\n    null,\n    true,\n    1e-05\n  ],\n  \"a\": "
            "\"x\\\"\\n\\u0001é/\",\n  \"e\": {},\n  \"l\": []\n}");
  EXPECT_EQ(RenderOrDie(value + "{{ v | tojson(sort_keys=true) }}", json::array(), options),
            "{\"a\": \"x\\\"\\n\\u0001é/\", \"b\": [1, 2.5, null, true, 1e-05], \"e\": {}, "
            "\"l\": []}");
  // A namespace's attributes outlive the loop that sets them; a plain set inside the loop does
  // not.
  EXPECT_EQ(RenderOrDie("{% set ns = namespace(n=0, seen=false) %}{% set plain = 0 %}"
                        "{% for m in messages %}{% set ns.n = ns.n + 1 %}{% set plain = 1 %}"
                        "{% if m.role == 'tool' %}{% set ns.seen = true %}{% endif %}{% endfor %}"
                        "{{ ns.n }} {{ ns.seen }} {{ plain }}",
                        json::parse(R"([{"role": "user", "content": "a"},
                                        {"role": "tool", "content": "b"}])"),
                        options),
            "2 True 0");
  EXPECT_EQ(RenderOrDie("{{ strftime_now('%A %d %B %Y, day %j') }} {{ strftime_now is defined }}",
                        json::array(), options),
            "Sunday 26 July 2026, day 207 True");
}

}  // namespace
}  // namespace kvserve
