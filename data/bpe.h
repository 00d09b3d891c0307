// Byte-level BPE tokenizers from a Hugging Face tokenizer.json (GPT-2's and Llama 3's family):
// the added tokens matched first, then the pre-tokenizer's split pattern (GPT-2's or Llama 3's,
// recognised by their text), the byte-to-unicode map, and the merges applied by rank. Decoding
// maps the tokens' strings back to bytes. Layout and limits: docs/data.md.
#ifndef TRAINER_BPE_H
#define TRAINER_BPE_H

#include <stddef.h>
#include <stdint.h>

typedef struct bpe bpe;

// Reads path. NULL with a message naming the file and the problem (not a BPE model, another
// pre-tokenizer, a merge of unknown tokens, ...).
bpe *bpe_load(const char *path, char *err, size_t n_err);
void bpe_free(bpe *b);
// One more than the largest token id (vocab and added tokens).
int32_t bpe_vocab_size(const bpe *b);
// The id of the token whose text is s (an added token such as "<|endoftext|>", or any vocab
// entry), or -1.
int32_t bpe_token_id(const bpe *b, const char *s);
// Appends the ids of text[0, n) to *ids (grown as needed; *n_ids and *cap updated). Linear in n
// up to the merges within each pre-token (words are cached).
void bpe_encode(bpe *b, const char *text, size_t n, int32_t **ids, int64_t *n_ids, int64_t *cap);
// Appends the bytes of ids[0, n) to *out (grown; *n_out and *cap updated). 0, or -1 when an id
// is outside the vocabulary.
int bpe_decode(const bpe *b, const int32_t *ids, int64_t n, char **out, size_t *n_out, size_t *cap);

#endif
