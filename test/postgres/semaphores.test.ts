import { defineSemaphoreSuite } from '../suites/semaphores.suite.js';
import { postgresFixture } from '../support/dialects.js';

defineSemaphoreSuite(postgresFixture, 16);
