import { z } from 'zod';

/** A run's priority: an integer from PRIORITY_MIN to PRIORITY_MAX, higher claimed first within a tool class; 0 by default (README "Priorities"). */
export const PRIORITY_MIN = -100;
export const PRIORITY_MAX = 100;
export const prioritySchema = z.int().min(PRIORITY_MIN).max(PRIORITY_MAX);
