// What the Express and Koa shops share: the stores, the order book and the start-up; each shop adds only its routes.
export { logStoreState, storesFromEnv, type Stores } from './stores.js';
export { MemoryOrderBook, RedisOrderBook, StaleFenceError, pay, type Order, type OrderBook } from './orders.js';
export { serveShop, type ShopOptions } from './serve.js';
