// Regenerates tests/data/vocab_llamacpp_counts.json: llama.cpp's own tokenizer over texts read from stdin.
// Build against the llama.cpp sources in the pinned sdist (cmake, target "llama"), then
//   g++ -std=c++17 -Iinclude -Iggml/include llamacpp_tokenize.cpp -Lbuild/bin -lllama -o tok
//   python -m tests.vocab_oracle ./tok
// argv: gguf [tokenizer.ggml.pre override] [parse_special 0/1] [bool key=0/1 override]
// stdin: texts separated by NUL; stdout: one line of ids per text.
#include "llama.h"
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>
#include <iostream>
#include <iterator>
static void quiet(ggml_log_level, const char *, void *) {}
int main(int argc, char ** argv) {
    llama_log_set(quiet, nullptr);
    llama_backend_init();
    auto params = llama_model_default_params();
    params.vocab_only = true;
    std::vector<llama_model_kv_override> ov(3);  // the last one, left empty, ends the list
    memset(ov.data(), 0, sizeof(llama_model_kv_override) * ov.size());
    size_t n_ov = 0;
    if (argc > 2 && strlen(argv[2]) > 0) {
        ov[n_ov].tag = LLAMA_KV_OVERRIDE_TYPE_STR;
        strcpy(ov[n_ov].key, "tokenizer.ggml.pre");
        strcpy(ov[n_ov++].val_str, argv[2]);
    }
    if (argc > 4 && strchr(argv[4], '=')) {  // a boolean key: "tokenizer.ggml.add_space_prefix=0"
        const char * eq = strchr(argv[4], '=');
        ov[n_ov].tag = LLAMA_KV_OVERRIDE_TYPE_BOOL;
        strncpy(ov[n_ov].key, argv[4], eq - argv[4]);
        ov[n_ov++].val_bool = atoi(eq + 1) != 0;
    }
    if (n_ov > 0) {
        params.kv_overrides = ov.data();
    }
    bool parse_special = argc > 3 ? atoi(argv[3]) != 0 : true;
    llama_model * model = llama_model_load_from_file(argv[1], params);
    if (!model) { fprintf(stderr, "load failed\n"); return 1; }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    std::string all((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    size_t pos = 0;
    while (pos <= all.size()) {
        size_t end = all.find('\0', pos);
        if (end == std::string::npos) end = all.size();
        std::string text = all.substr(pos, end - pos);
        std::vector<llama_token> ids(text.size() * 4 + 16);
        int n = llama_tokenize(vocab, text.data(), text.size(), ids.data(), ids.size(), false, parse_special);
        for (int i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
        printf("\n");
        if (end == all.size()) break;
        pos = end + 1;
    }
    return 0;
}
