// Starts the Express shop: PORT (default 3000, 0 = any free port), REDIS_URL / REDIS_NODES, PAYMENT_MS; stops on SIGINT/SIGTERM.
import { serveShop } from '@hasp/example-shop-common';
import { createApp } from './app.js';

serveShop('express-shop', createApp);
