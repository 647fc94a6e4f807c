// Bundles src/main.jsx and everything it imports (React, MUI, Perses's libraries and plugins) into dist/:
// one script, no CDN at run time. `npm run build` (make viewer).
import { build } from 'esbuild';
import { copyFileSync, mkdirSync } from 'node:fs';
import { createRequire } from 'node:module';

// One copy of each library that holds React context: a package reached by both `import` and `require` would
// otherwise be bundled twice (ESM and CJS builds) and its provider would not be the one its hooks read.
const require = createRequire(import.meta.url);
const single = {
  name: 'single-copy',
  setup(b) {
    b.onResolve({ filter: /^@tanstack\/react-query$/ }, () => ({
      path: require.resolve('@tanstack/react-query').replace(/index\.js$/, 'index.mjs'),
    }));
  },
};

mkdirSync('dist', { recursive: true });
await build({
  entryPoints: ['src/main.jsx'],
  bundle: true,
  minify: true,
  format: 'esm',
  target: 'es2020',
  jsx: 'automatic',
  loader: { '.js': 'jsx', '.woff': 'file', '.woff2': 'file', '.ttf': 'file', '.svg': 'file', '.png': 'file' },
  define: { 'process.env.NODE_ENV': '"production"', global: 'globalThis' },
  outdir: 'dist',
  entryNames: 'viewer',
  logLevel: 'warning',
  legalComments: 'linked',
  plugins: [single],
});
copyFileSync('src/index.html', 'dist/index.html');
