// Helpers shared by the HTTP adapters (@hasp/express, @hasp/koa).
export {};
