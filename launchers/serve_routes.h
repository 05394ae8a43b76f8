// `kolos serve`'s HTTP routes (launchers/serve_routes.cpp): the OpenAI-style
// endpoints, /tokenize, /detokenize, /health and /metrics, registered on
// cpp-httplib's server over a Server (serve_server.h).
#pragma once

#include <httplib.h>

#include "serve_server.h"

namespace kolos::cli::serve {

// Registers every route and the error handler on `http`; the handlers use
// `server`, which must outlive `http`'s listening.
void add_routes(httplib::Server& http, Server& server);

}  // namespace kolos::cli::serve
