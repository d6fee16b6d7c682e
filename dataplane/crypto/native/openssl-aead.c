/*
 * ChaCha20-Poly1305 (RFC 8439) through OpenSSL 3's EVP interface, one call per seal or open: the
 * native half of the "openssl-ffi" crypto provider (../openssl-ffi.ts).
 *
 * Why a C file at all: on the project's machine OpenSSL seals a 1420-byte packet in about half the
 * time libsodium takes, but only when its four EVP calls per packet (key and nonce, data, final,
 * tag) are made from C; called one by one through the FFI, their overhead eats the gain
 * (docs/data-workers.md). So this file makes the four calls and nothing else.
 *
 * Built at install time by scripts/build-native.mjs, against the prototypes below rather than
 * OpenSSL's headers (only the runtime library, libcrypto.so.3, is needed). When it cannot be built
 * or loaded, the provider reports itself unavailable and the selection moves on (select.ts).
 *
 * Each thread has its own cipher context (the crypto workers call in parallel). Keys are copied
 * into the context for one operation; OpenSSL keeps the last one there until the next operation
 * overwrites it, so after an operation the context is reset (EVP_CIPHER_CTX_reset would free it;
 * re-initialising with a zero key is enough and keeps it allocated).
 */
#include <stddef.h>
#include <string.h>

typedef struct evp_cipher_ctx_st EVP_CIPHER_CTX;
typedef struct evp_cipher_st EVP_CIPHER;

extern EVP_CIPHER_CTX *EVP_CIPHER_CTX_new(void);
extern const EVP_CIPHER *EVP_chacha20_poly1305(void);
extern int EVP_CipherInit_ex(EVP_CIPHER_CTX *ctx, const EVP_CIPHER *cipher, void *engine,
                             const unsigned char *key, const unsigned char *iv, int enc);
extern int EVP_CipherUpdate(EVP_CIPHER_CTX *ctx, unsigned char *out, int *outl, const unsigned char *in, int inl);
extern int EVP_CipherFinal_ex(EVP_CIPHER_CTX *ctx, unsigned char *out, int *outl);
extern int EVP_CIPHER_CTX_ctrl(EVP_CIPHER_CTX *ctx, int type, int arg, void *ptr);

#define CTRL_AEAD_GET_TAG 0x10 /* EVP_CTRL_AEAD_GET_TAG */
#define CTRL_AEAD_SET_TAG 0x11 /* EVP_CTRL_AEAD_SET_TAG */
#define TAG_SIZE 16
/* Larger inputs than an int can hold are refused (EVP takes int lengths); packets are far smaller. */
#define MAX_LENGTH 0x7fffff00u

static __thread EVP_CIPHER_CTX *thread_context;

static EVP_CIPHER_CTX *context(int encrypt) {
  if (thread_context == NULL) {
    EVP_CIPHER_CTX *created = EVP_CIPHER_CTX_new();
    if (created == NULL) return NULL;
    if (EVP_CipherInit_ex(created, EVP_chacha20_poly1305(), NULL, NULL, NULL, encrypt) != 1) return NULL;
    thread_context = created;
  }
  return thread_context;
}

static const unsigned char zero_key[32];
static const unsigned char zero_nonce[12];

/* Overwrites the key the context holds: it must not outlive the operation that used it. */
static void forget_key(EVP_CIPHER_CTX *ctx) {
  EVP_CipherInit_ex(ctx, NULL, NULL, zero_key, zero_nonce, 1);
}

/*
 * Seals `length` bytes of `in` with `ad` (may be NULL when ad_length is 0) into `out`: the
 * ciphertext, then the 16-byte tag (length + 16 bytes). `out` may be `in` (in place).
 * Returns 0, or -1 when OpenSSL fails (then `out` holds nothing usable).
 */
int rg_chacha20poly1305_seal(const unsigned char *key, const unsigned char *nonce,
                             const unsigned char *in, unsigned int length,
                             const unsigned char *ad, unsigned int ad_length, unsigned char *out) {
  if (length > MAX_LENGTH || ad_length > MAX_LENGTH) return -1;
  EVP_CIPHER_CTX *ctx = context(1);
  if (ctx == NULL) return -1;
  int n = 0, ok = EVP_CipherInit_ex(ctx, NULL, NULL, key, nonce, 1) == 1;
  if (ok && ad_length > 0) ok = EVP_CipherUpdate(ctx, NULL, &n, ad, (int)ad_length) == 1;
  if (ok && length > 0) ok = EVP_CipherUpdate(ctx, out, &n, in, (int)length) == 1;
  if (ok) ok = EVP_CipherFinal_ex(ctx, out + length, &n) == 1;
  if (ok) ok = EVP_CIPHER_CTX_ctrl(ctx, CTRL_AEAD_GET_TAG, TAG_SIZE, out + length) == 1;
  forget_key(ctx);
  return ok ? 0 : -1;
}

/*
 * Opens `length` bytes of ciphertext followed by its 16-byte tag (`in` holds length + 16 bytes)
 * with `ad` into `out` (`length` bytes; may be `in`). Returns 0 when the tag verifies; otherwise
 * -1, and `out` is zeroed, so that unauthenticated plaintext never leaves this function.
 */
int rg_chacha20poly1305_open(const unsigned char *key, const unsigned char *nonce,
                             const unsigned char *in, unsigned int length,
                             const unsigned char *ad, unsigned int ad_length, unsigned char *out) {
  if (length > MAX_LENGTH || ad_length > MAX_LENGTH) return -1;
  EVP_CIPHER_CTX *ctx = context(0);
  if (ctx == NULL) return -1;
  unsigned char tag[TAG_SIZE];
  memcpy(tag, in + length, TAG_SIZE); /* before an in-place open could touch it */
  int n = 0, ok = EVP_CipherInit_ex(ctx, NULL, NULL, key, nonce, 0) == 1;
  if (ok) ok = EVP_CIPHER_CTX_ctrl(ctx, CTRL_AEAD_SET_TAG, TAG_SIZE, tag) == 1;
  if (ok && ad_length > 0) ok = EVP_CipherUpdate(ctx, NULL, &n, ad, (int)ad_length) == 1;
  if (ok && length > 0) ok = EVP_CipherUpdate(ctx, out, &n, in, (int)length) == 1;
  if (ok) ok = EVP_CipherFinal_ex(ctx, out + length, &n) == 1;
  forget_key(ctx);
  if (!ok) memset(out, 0, length);
  return ok ? 0 : -1;
}

/*
 * The batch forms: `count` messages in one call, one per slot of `stride` bytes in `data`
 * (`data_length` bytes), each at `offset` within its slot, with the nonce 0^4 ‖ le64(counter):
 * WireGuard's transport nonce (the whitepaper's §5.4.6). One call per batch instead of one per
 * packet saves the foreign call and its argument checks per packet (docs/data-workers.md).
 * Every bound is checked here against `data_length`, so a wrong length from the caller cannot
 * make either function write outside `data`.
 */

/* The 12-byte nonce of a counter passed as a double (exact below 2^53); 0 when not a counter. */
static int counter_nonce(double counter, unsigned char nonce[12]) {
  if (!(counter >= 0 && counter < 18446744073709551616.0)) return 0;
  unsigned long long c = (unsigned long long)counter;
  memset(nonce, 0, 4);
  for (int b = 0; b < 8; b++) nonce[4 + b] = (unsigned char)(c >> (8 * b));
  return 1;
}

/*
 * Seals lengths[i] bytes at slot i's `offset`, in place, the tag after them. Returns 0, or -1 when
 * an argument is out of bounds or OpenSSL fails (then what was sealed so far must not be sent).
 */
int rg_chacha20poly1305_seal_slots(const unsigned char *key, unsigned char *data, unsigned int data_length,
                                   unsigned int stride, unsigned int offset, unsigned int count,
                                   const int *lengths, const double *counters) {
  if (stride == 0 || count > data_length / stride || offset > stride) return -1;
  EVP_CIPHER_CTX *ctx = context(1);
  if (ctx == NULL) return -1;
  unsigned char nonce[12];
  int ok = 1;
  for (unsigned int i = 0; ok && i < count; i++) {
    int length = lengths[i];
    if (length < 0 || (unsigned int)length > stride - offset || stride - offset - (unsigned int)length < TAG_SIZE
        || !counter_nonce(counters[i], nonce)) { ok = 0; break; }
    unsigned char *message = data + (size_t)i * stride + offset;
    int n = 0;
    ok = EVP_CipherInit_ex(ctx, NULL, NULL, key, nonce, 1) == 1;
    if (ok && length > 0) ok = EVP_CipherUpdate(ctx, message, &n, message, length) == 1;
    if (ok) ok = EVP_CipherFinal_ex(ctx, message + length, &n) == 1;
    if (ok) ok = EVP_CIPHER_CTX_ctrl(ctx, CTRL_AEAD_GET_TAG, TAG_SIZE, message + length) == 1;
  }
  forget_key(ctx);
  return ok ? 0 : -1;
}

/*
 * Opens slot i's lengths[i] bytes at `offset` (ciphertext ‖ tag), in place. lengths[i] becomes
 * the plaintext length, or -1 when the message is shorter than a tag, longer than its slot, or
 * does not authenticate (its bytes are then zeroed: unauthenticated plaintext never leaves this
 * function). Returns 0, or -1 when the run does not fit `data` (nothing opened: every length -1).
 */
int rg_chacha20poly1305_open_slots(const unsigned char *key, unsigned char *data, unsigned int data_length,
                                   unsigned int stride, unsigned int offset, unsigned int count,
                                   int *lengths, const double *counters) {
  if (stride == 0 || count > data_length / stride || offset > stride) {
    for (unsigned int i = 0; i < count; i++) lengths[i] = -1;
    return -1;
  }
  EVP_CIPHER_CTX *ctx = context(0);
  if (ctx == NULL) {
    for (unsigned int i = 0; i < count; i++) lengths[i] = -1;
    return -1;
  }
  unsigned char nonce[12], tag[TAG_SIZE];
  for (unsigned int i = 0; i < count; i++) {
    int length = lengths[i] - TAG_SIZE;
    if (length < 0 || (unsigned int)lengths[i] > stride - offset || !counter_nonce(counters[i], nonce)) {
      lengths[i] = -1;
      continue;
    }
    unsigned char *message = data + (size_t)i * stride + offset;
    memcpy(tag, message + length, TAG_SIZE);
    int n = 0, ok = EVP_CipherInit_ex(ctx, NULL, NULL, key, nonce, 0) == 1;
    if (ok) ok = EVP_CIPHER_CTX_ctrl(ctx, CTRL_AEAD_SET_TAG, TAG_SIZE, tag) == 1;
    if (ok && length > 0) ok = EVP_CipherUpdate(ctx, message, &n, message, length) == 1;
    if (ok) ok = EVP_CipherFinal_ex(ctx, message + length, &n) == 1;
    if (!ok) memset(message, 0, (size_t)length);
    lengths[i] = ok ? length : -1;
  }
  forget_key(ctx);
  return 0;
}
