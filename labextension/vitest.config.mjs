import os from 'node:os';
import path from 'node:path';

import { defineConfig } from 'vitest/config';

export default defineConfig({
  // Keep Vite's cache out of labextension/: the wheel build compares the
  // mtimes of labextension/ with the built extension to decide whether to
  // rebuild, and a fresh cache file would force a rebuild every time.
  cacheDir: path.join(os.tmpdir(), 'gpupool-hub-balance-vite'),
  test: {
    include: ['test/**/*.test.ts'],
    environment: 'node'
  }
});
