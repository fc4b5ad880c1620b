// Types for the side-by-side framework installs (npm aliases): each major gets the types of its package.
// `import x = require()` is the only way to re-export an `export =` module from an ambient declaration.
/* eslint-disable @typescript-eslint/no-require-imports */
declare module 'express4' {
  import express = require('express');
  export = express;
}
declare module 'express5' {
  import express = require('express');
  export = express;
}
declare module 'koa2' {
  import Koa = require('koa');
  export = Koa;
}
declare module 'koa3' {
  import Koa = require('koa');
  export = Koa;
}
