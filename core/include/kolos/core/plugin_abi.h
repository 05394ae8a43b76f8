/* The C boundary between kolos and a strategy plugin.
 *
 * A plugin is libkolos_<name>.so exporting one C symbol, `kolos_plugin_v1`,
 * a function returning a pointer to a static descriptor. The core compares
 * the descriptor's ABI, kolos and LibTorch versions with its own before it
 * calls anything else, and refuses a mismatch with a message naming both
 * sides; the LibTorch version it reads from the file's build stamp (below)
 * before it even loads the file. `create` never lets an exception out: it
 * returns NULL and writes the message into `error` (KOLOS_DEFINE_PLUGIN in
 * plugin_registry.h does this).
 *
 * The object `create` returns is the plugin's implementation of the role's
 * C++ interface (e.g. kolos::GradientStrategy for role "gradients"), cast to
 * void* from a pointer to that interface; the core casts it back and
 * destroys it with `destroy`, keeping the library loaded until then.
 */
#ifndef KOLOS_CORE_PLUGIN_ABI_H_
#define KOLOS_CORE_PLUGIN_ABI_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KOLOS_PLUGIN_ABI_VERSION 1u
#define KOLOS_PLUGIN_ENTRY_SYMBOL "kolos_plugin_v1"

typedef struct kolos_plugin_descriptor {
  uint32_t abi_version;      /* KOLOS_PLUGIN_ABI_VERSION at build time */
  const char* name;          /* "dp", "zero1", "tp1d", ... */
  const char* role;          /* "layers", "sequence", "pipeline", "gradients", "memory", "planner" */
  const char* kolos_version; /* KOLOS_VERSION at build time */
  const char* torch_version; /* KOLOS_TORCH_VERSION at build time */
  const char* compiler;      /* KOLOS_COMPILER at build time */
  const char* description;   /* one line for `kolos plugins` */
  void* (*create)(char* error, size_t error_len);
  void (*destroy)(void* object);
} kolos_plugin_descriptor;

typedef const kolos_plugin_descriptor* (*kolos_plugin_entry_fn)(void);

/* The build stamp: the kolos and LibTorch versions again, as text in an ELF
 * section of the plugin file, which the core reads before it dlopens the
 * file. Loading a plugin loads the LibTorch it was linked with; one built
 * against another LibTorch brings a second LibTorch into the process, whose
 * initialisers bind to the first one's same-named symbols (measured: a plugin
 * built against Debian's 1.13 crashed a kolos built against 2.15 with SIGBUS
 * inside dlopen, and the reverse with SIGSEGV), so the descriptor's check
 * alone would come too late. A file without the section is loaded and its
 * descriptor checked as before. The text: "kolos=<version> torch=<version>".
 * KOLOS_DEFINE_PLUGIN (plugin_registry.h) stamps every plugin. */
#define KOLOS_PLUGIN_STAMP_SECTION ".kolos_plugin_stamp"
#define KOLOS_PLUGIN_STAMP(KOLOS_VERSION_TEXT, TORCH_VERSION_TEXT)                               \
  __attribute__((used,                                                                           \
                 section(KOLOS_PLUGIN_STAMP_SECTION))) static const char kolos_plugin_stamp_[] = \
      "kolos=" KOLOS_VERSION_TEXT " torch=" TORCH_VERSION_TEXT;

#ifdef __cplusplus
}
#endif

#endif /* KOLOS_CORE_PLUGIN_ABI_H_ */
