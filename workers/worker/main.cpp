// inferd-worker: see worker.h.
#include "worker.h"

int main(int argc, char** argv) { return inferd::worker::worker_main(argc, argv); }
